"""A seeded uniform random sample of each module's mutants, for a score where a full run does not fit the time
(run from the scratch copy, after mutmut has generated the mutants, e.g. by a first `mutmut run` that was stopped):

    python -m mutmut run $(python bench/mutation/sample.py --per-module 150 --unchecked)   # run the sample
    python bench/mutation/summarize.py --sample-of <the same arguments>                    # (see summarize.py)

The sample is drawn from ALL of a module's mutants (numpy default_rng(seed), without replacement), whatever
mutmut's own order and whatever was already checked, so the detected fraction within it estimates the module's
score without the bias of mutmut's order (which checks cheap mutants first). ``--unchecked`` prints only the
sampled mutants that have no result yet (those that do keep theirs).
"""

import argparse
import collections

import numpy as np

import mutmut.__main__ as mutmut_main


def sample(per_module, seed=0):
    """{module: [mutant names]} of at most ``per_module`` mutants per module, and {name: status} of all."""
    by_module, status = collections.defaultdict(list), {}
    for path in mutmut_main.walk_mutatable_files():
        data = mutmut_main.SourceFileMutationData(path=path)
        data.load()
        for name, exit_code in data.exit_code_by_key.items():
            by_module[name.split(".x_")[0].split(".xǁ")[0]].append(name)
            status[name] = mutmut_main.status_by_exit_code[exit_code]
    rng = np.random.default_rng(seed)
    chosen = {}
    for module in sorted(by_module):
        names = sorted(by_module[module])
        take = rng.permutation(len(names))[:per_module]
        chosen[module] = [names[i] for i in sorted(take)]
    return chosen, status


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-module", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--unchecked", action="store_true", help="only the sampled mutants without a result")
    args = parser.parse_args()
    chosen, status = sample(args.per_module, args.seed)
    for names in chosen.values():
        for name in names:
            if not args.unchecked or status[name] == "not checked":
                print(name)


if __name__ == "__main__":
    main()
