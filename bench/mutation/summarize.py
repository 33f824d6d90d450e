"""Summarise a mutmut 3 run (called by run.sh from the scratch copy, or by hand there): counts per module and
status, and the diff of every surviving or timed-out mutant, as Markdown on stdout.

It reads mutmut's result files and makes the diffs in this one process (mutmut's own functions); calling
`mutmut show` once per mutant, as it first did, took a core for 20 minutes and more on a run of 1,000 survivors.

    python bench/mutation/summarize.py [--seconds S] [--status survived --status timeout ...]
"""

import argparse
import collections

import mutmut.__main__ as mutmut_main
from mutmut.mutation.diff_apply import get_diff_for_mutant


def collect():
    """[(module, mutant name, status)] for every mutant of the run, in mutmut's file order."""
    rows = []
    for path in mutmut_main.walk_mutatable_files():
        data = mutmut_main.SourceFileMutationData(path=path)
        data.load()
        for name, exit_code in data.exit_code_by_key.items():
            module = name.split(".x_")[0].split(".xǁ")[0]
            rows.append((module, name, mutmut_main.status_by_exit_code[exit_code], path))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=None, help="wall time of the run, for the header")
    parser.add_argument("--status", action="append", default=None,
                        help="statuses whose diffs are listed (default: every status but killed and not checked)")
    parser.add_argument("--sample-per-module", type=int, default=None, metavar="N",
                        help="count only the seeded sample of bench/mutation/sample.py (same N and --seed)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rows = collect()
    if args.sample_per_module is not None:
        import os
        import sys
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from sample import sample

        chosen = {name for names in sample(args.sample_per_module, args.seed)[0].values() for name in names}
        rows = [row for row in rows if row[1] in chosen]
        print(f"(a uniform sample of {args.sample_per_module} mutants per module, seed {args.seed}; "
              "bench/mutation/sample.py)\n")
    statuses = collections.defaultdict(collections.Counter)
    for module, _, status, _ in rows:
        statuses[module][status] += 1
    all_status = sorted({s for c in statuses.values() for s in c})
    print("# mutmut run" + (f" ({args.seconds / 60:.1f} min)" if args.seconds is not None else ""))
    print()
    print("| module | " + " | ".join(all_status) + " | detected (killed + timeout) / (total - no tests - not checked) |")
    print("|---|" + "---|" * (len(all_status) + 1))
    total = collections.Counter()
    for module in sorted(statuses):
        counts = statuses[module]
        total.update(counts)
        tested = sum(counts.values()) - counts.get("no tests", 0) - counts.get("not checked", 0)
        print(f"| {module} | " + " | ".join(str(counts.get(s, 0)) for s in all_status)
              + f" | {(counts.get('killed', 0) + counts.get('timeout', 0)) / max(1, tested):.1%} |")
    tested = sum(total.values()) - total.get("no tests", 0) - total.get("not checked", 0)
    print("| **all** | " + " | ".join(str(total.get(s, 0)) for s in all_status)
          + f" | {(total.get('killed', 0) + total.get('timeout', 0)) / max(1, tested):.1%} |")
    listed = collections.defaultdict(list)
    for _, name, status, path in rows:
        if (status in args.status) if args.status else status not in ("killed", "not checked"):
            listed[status].append((name, path))
    for status in sorted(listed):
        print(f"\n## {status} ({len(listed[status])})\n")
        for name, path in listed[status]:
            try:
                diff = get_diff_for_mutant(name, path=path).strip()
            except Exception as error:  # an index out of date: say so rather than stop the summary
                diff = f"(no diff: {type(error).__name__}: {error})"
            print(f"### {name}\n\n```diff\n{diff}\n```\n")


if __name__ == "__main__":
    main()
