"""Summarise a mutmut 3 run (called by run.sh from the scratch copy): counts per module and status, and the
diff of every surviving or timed-out mutant, as Markdown on stdout."""

import argparse
import collections
import re
import subprocess
import sys


def mutmut(*args):
    return subprocess.run([sys.executable, "-m", "mutmut", *args], capture_output=True, text=True).stdout


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=None, help="wall time of the run, for the header")
    args = parser.parse_args()
    statuses = collections.defaultdict(collections.Counter)
    listed = collections.defaultdict(list)
    for line in mutmut("results", "--all", "true").splitlines():
        match = re.match(r"\s*([\w.]+__mutmut_\d+): (.+)$", line)
        if not match:
            continue
        name, status = match.group(1), match.group(2).strip()
        module = name.split(".x_")[0].split(".xǁ")[0]
        statuses[module][status] += 1
        if status not in ("killed",):
            listed[status].append(name)
    all_status = sorted({s for c in statuses.values() for s in c})
    print("# mutmut run" + (f" ({args.seconds / 60:.1f} min)" if args.seconds is not None else ""))
    print()
    print("| module | " + " | ".join(all_status) + " | detected (killed + timeout) / (total - no tests) |")
    print("|---|" + "---|" * (len(all_status) + 1))
    total = collections.Counter()
    for module in sorted(statuses):
        counts = statuses[module]
        total.update(counts)
        rows = [str(counts.get(s, 0)) for s in all_status]
        tested = sum(counts.values()) - counts.get("no tests", 0)
        print(f"| {module} | " + " | ".join(rows) + f" | {(counts.get('killed', 0) + counts.get('timeout', 0)) / max(1, tested):.1%} |")
    tested = sum(total.values()) - total.get("no tests", 0)
    print("| **all** | " + " | ".join(str(total.get(s, 0)) for s in all_status)
          + f" | {(total.get('killed', 0) + total.get('timeout', 0)) / max(1, tested):.1%} |")
    for status in sorted(listed):
        print(f"\n## {status} ({len(listed[status])})\n")
        for name in listed[status]:
            print(f"### {name}\n\n```diff\n{mutmut('show', name).strip()}\n```\n")


if __name__ == "__main__":
    main()
