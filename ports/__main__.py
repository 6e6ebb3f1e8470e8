"""`python -m ports`: the survey of the EGGROLL ports on PyPI (`make ports` installs them and runs it).

Exit codes: 0 every port was surveyed (its verdicts, whatever they are, are findings); 1 a port could not be
surveyed (not installed, its adapter failed to load, or the suite crashed on it: see its section); 2 bad usage.
"""
from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path
from typing import Sequence

from parity.mlp.sizes import SIZES
from ports import registry
from ports.report import SurveyInfo, write
from ports.survey import SUITE_PACKAGES, survey_entry
from reporting import versions
from spec.limits import check_out_dir, seed_arg


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise ValueError(f"{message}\n\n{self.format_usage().strip()}")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m ports", description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/ports", help="output folder (default runs/ports, which git ignores; the "
                                                         "published survey is reports/ports)")
    p.add_argument("--size", choices=sorted(SIZES), default="quick", help="the suite's size (default quick)")
    p.add_argument("--seed", type=seed_arg, default=0, help="run seed of the suite, in [0, 2^32 - 1] (default 0)")
    p.add_argument("--only", default=None, help="comma-separated port keys (see --list)")
    p.add_argument("--list", action="store_true", help="list the ports and exit")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    return p


def chosen(args) -> list[registry.Entry]:
    if args.only is None:
        return list(registry.entries())
    return registry.by_key([k.strip() for k in args.only.split(",") if k.strip()])


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
        entries = chosen(args)
        check_out_dir(args.out)
    except ValueError as err:
        print(f"python -m ports: {err}", file=sys.stderr)
        return 2
    if args.list:
        for e in entries:
            print(f"{e.key:24s} {e.spec:36s} {e.dist}=={e.pinned}")
        return 0
    import torch
    torch.set_num_threads(1)      # the suite's tensors are small: one thread avoids oversubscription
    from parity.__main__ import device_description

    log = (lambda line: None) if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    out, sizes, device = Path(args.out), SIZES[args.size], device_description("cpu")
    started, t0 = time.strftime("%Y-%m-%dT%H:%M:%S"), time.perf_counter()
    results = []
    for e in entries:
        log(f"== {e.key}: {e.spec} ({e.dist}=={e.pinned})")
        results.append(survey_entry(e, sizes, args.seed, out, device, log))
        r = results[-1]
        log(f"== {e.key}: {r.status}" + (f", {r.verdict}, drifts named: {', '.join(r.knobs) or 'none'}, "
                                         f"{r.seconds:.0f} s" if r.results else f": {r.error.splitlines()[-1]}"))
    info = SurveyInfo("python -m ports " + shlex.join(argv), sizes.name, args.seed, versions(SUITE_PACKAGES), device,
                      started, time.perf_counter() - t0)
    path = write(out, results, info)
    print(f"survey: {path}")
    return 0 if all(r.status == "checked" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
