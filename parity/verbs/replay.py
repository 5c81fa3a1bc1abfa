"""``python -m parity replay BUNDLE``: rerun a repro bundle and say whether it reproduced
(parity-contract.md §6; bundles: :mod:`parity.sessions.bundle`).

The replay names the kernel it runs and the git revision the bundle was recorded at (a warning
when either differs from now), checks the bundle's fields first (:mod:`parity.sessions.bundle_checks`) and
reruns the case with the recorded options on any device. ``--kernel SPEC`` runs another kernel on
the recorded case (check a fix against a recorded failure). The exit status answers the question
asked:

* ``replay BUNDLE`` (``--expect reproduce``): 0 when the recorded verdict reproduces (the same
  failures, :func:`verdict_key`; identical checks are reported as such), 1 when it does not;
* ``replay BUNDLE --expect identical``: 0 only when every check is identical to the bundle's
  (counts and locations too);
* ``replay BUNDLE --expect pass``: 0 only when every check now passes, 1 otherwise;
* 2: a usage error (not a bundle, a damaged or absurd bundle, a kernel that does not load).
"""
from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from typing import Optional

# pandas, torch and the bundle module are imported inside the functions: building the CLI
# parser (add_replay_parser) must not import torch.

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
EXPECT = ("reproduce", "identical", "pass")


def verdict_key(df: pd.DataFrame) -> set:
    """The verdict of a run as a set: ``(case, size, step, output, verdict)`` of every failure
    (empty for a pass). A replay reproduces a bundle's verdict when the sets are equal, even if
    mismatch counts or locations moved (a fault reading uninitialized memory)."""
    import pandas as pd

    from ..checking import compare as cmp
    fails = df[df["verdict"].map(cmp.is_failure)] if len(df) else df
    return {(str(r["case"]), str(r["size"]), "" if pd.isna(r["step"]) else int(r["step"]), str(r["output"]),
             str(r["verdict"])) for r in fails.to_dict("records")}


@dataclass
class ReplayOutcome:
    """What :func:`replay` did.

    Attributes:
        bundle: the loaded :class:`Bundle`. result: the new :class:`parity.running.runner.CaseResult`.
        diff: :func:`diff_findings` of the recorded vs the new checks (empty: identical).
        kernel: the kernel spec that ran; recorded_kernel: the bundle's.
        git_now / git_recorded: :func:`git_revision` of this checkout and the bundle's.
    """

    bundle: "parity.sessions.bundle.Bundle"
    result: object
    diff: "pandas.DataFrame"
    kernel: str
    recorded_kernel: str
    git_now: dict
    git_recorded: dict

    @property
    def identical(self) -> bool:
        """Every check identical to the bundle's, and as many steps run."""
        return self.diff.empty and self.result.steps_run == self.bundle.data.get("steps_run", self.result.steps_run)

    @property
    def verdict_reproduced(self) -> bool:
        """The same failures (:func:`verdict_key`) as recorded, and as many steps run."""
        return (verdict_key(self.bundle.findings) == verdict_key(self.result.findings)
                and self.result.steps_run == self.bundle.data.get("steps_run", self.result.steps_run))

    def warnings(self) -> list:
        """Why the replay may not be the recorded run: another kernel, another git revision, a
        dirty checkout on either side."""
        out = []
        if self.kernel != self.recorded_kernel:
            out.append(f"kernel {self.kernel} replaces the recorded {self.recorded_kernel}")
        now, rec = self.git_now.get("revision"), self.git_recorded.get("revision")
        if now and rec and now != rec:
            out.append(f"recorded at git {rec[:12]}, this checkout is {now[:12]}")
        if self.git_recorded.get("dirty"):
            out.append("recorded from a checkout with uncommitted changes")
        if self.git_now.get("dirty"):
            out.append("this checkout has uncommitted changes")
        return out


def replay(directory: str, *, device: Optional[str] = None, console=None,
           kernel: Optional[str] = None) -> ReplayOutcome:
    """Rerun a bundle's case with its recorded options on ``device`` (default: the resolved one).

    Args:
        directory: the bundle.
        device: backend (default: resolved, npu > cuda > cpu).
        kernel: run this kernel spec instead of the recorded one (check a fix against a recorded
            failure); ``None`` keeps the bundle's.
    Returns:
        :class:`ReplayOutcome` (program ids compared only on the recording backend).
    Raises:
        FileNotFoundError / ValueError: see :func:`load_bundle`; ValueError also for a ``kernel``
        that cannot be loaded.
    """
    from kpool.platform import resolve_device

    from ..sessions.bundle import diff_findings, git_revision, load_bundle
    from ..sessions.bundle_checks import needs_explicit_kernel
    from .. import api
    from ..sessions.session import run_cases
    dev = resolve_device(device)
    b = load_bundle(directory)
    if kernel is None and needs_explicit_kernel(b.options.kernel):
        raise ValueError(f"the bundle was recorded with kernel {b.options.kernel!r}, code outside this checkout: "
                         f"replay it with --kernel {b.options.kernel} (a bundle does not choose code to load)")
    opts = dataclasses.replace(b.options, device=dev, kernel=kernel or b.options.kernel)
    try:
        api.resolve_implementation(opts.kernel)
    except Exception as exc:
        raise ValueError(f"cannot load kernel {opts.kernel!r}: {type(exc).__name__}: {exc}") from exc
    (result,) = run_cases([b.case], opts, console=console)
    diff = diff_findings(b.findings, result.findings, with_programs=dev == b.options.device)
    return ReplayOutcome(bundle=b, result=result, diff=diff, kernel=opts.kernel, recorded_kernel=b.options.kernel,
                         git_now=git_revision(), git_recorded=dict(b.environment.get("git") or {}))


def add_replay_parser(sub) -> None:
    """The ``replay`` sub-command (no torch import)."""
    p = sub.add_parser("replay", help="rerun a repro bundle and say whether it reproduced",
                       description="Rerun a repro bundle (fresh process, any device) with its recorded options. "
                                   "Exit 0 when the recorded verdict reproduces (--expect reproduce, default) or "
                                   "when every check passes (--expect pass), 1 otherwise, 2 for a bad bundle.")
    p.add_argument("bundle", metavar="BUNDLE", help="bundle directory (written by run / record)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda", "npu"),
                   help="kernel device (default: auto, npu > cuda > cpu)")
    p.add_argument("--kernel", default=None, metavar="SPEC",
                   help="run this kernel instead of the recorded one (e.g. kpool, to check a fix with --expect pass)")
    p.add_argument("--expect", default="reproduce", choices=EXPECT,
                   help="reproduce (default): exit 0 when the recorded verdict (the failures) reproduces; "
                        "identical: only when every check is identical; pass: only when every check now passes")
    p.add_argument("--report", metavar="DIR", help="write the replay's results.csv, results.json, summary.md here")
    p.add_argument("--junit", metavar="FILE", help="write the replay's JUnit XML here")
    p.add_argument("--failures-only", action="store_true", help="print only failing rows")
    p.add_argument("--all-rows", action="store_true", help="print every row (default: the non-exact ones)")


def replay_main(args, console=None) -> int:
    """``python -m parity replay BUNDLE``: rerun, print, and exit as the module docstring says."""
    from rich.markup import escape

    from kpool.errors import KPoolUnsupportedError

    from ..reporting import report
    from ..reporting.report import make_console
    console = console or make_console()
    prog = "python -m parity replay"
    try:
        done = replay(args.bundle, device=None if args.device == "auto" else args.device, console=console,
                      kernel=args.kernel)
    except (FileNotFoundError, ValueError, KPoolUnsupportedError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    b, result = done.bundle, done.result
    git = done.git_recorded
    console.print(f"replayed {escape(b.case.case_id)} from {escape(args.bundle)}: kernel={escape(done.kernel)}, "
                  f"{len(b.case.steps)} steps; "
                  f"recorded with kernel={escape(done.recorded_kernel)} on "
                  f"{escape(str(b.environment.get('device_name')))} at git {escape(str(git.get('revision')))}"
                  + (" (dirty)" if git.get("dirty") else ""))
    for text in done.warnings():
        console.print(f"[yellow]warning:[/] {escape(text)}")
    df = report.results_table([result])
    report.print_results(df, wall_s=result.wall_s, console=console, failures_only=args.failures_only,
                         all_rows=args.all_rows)
    if args.report:
        report.write_report(df, args.report, wall_s=result.wall_s, run=dataclasses.asdict(b.options))
    if args.junit:
        report.write_junit(df, args.junit)
    summary = report.summarize(df)
    if args.expect == "pass":
        if result.ok:
            console.print(f"[green]passes: every one of the {summary['checks']} checks passes with "
                          f"kernel={escape(done.kernel)}[/]")
            return EXIT_OK
        console.print(f"[red]still failing: {summary['failures']} failures with kernel={escape(done.kernel)}[/]")
        return EXIT_FAIL
    if done.identical:
        console.print(f"[green]reproduced: {len(result.findings)} checks identical to the bundle's "
                      f"({summary['findings']} findings, {summary['failures']} failures)[/]")
        return EXIT_OK
    console.print(f"[{'yellow' if done.verdict_reproduced else 'red'}]checks differ from the bundle "
                  f"({len(done.diff)} rows):[/]")
    console.print(escape(done.diff.to_string(index=False)))
    if result.steps_run != b.data.get("steps_run", result.steps_run):
        console.print(f"[red]{result.steps_run} steps ran, the bundle recorded {b.data.get('steps_run')}[/]")
    if done.verdict_reproduced:
        console.print(f"[{'red' if args.expect == 'identical' else 'green'}]reproduced the verdict: the same "
                      f"{summary['failures']} failures (counts or locations moved)[/]")
        return EXIT_FAIL if args.expect == "identical" else EXIT_OK
    console.print("[red]not reproduced: the failures differ from the bundle's[/]")
    return EXIT_FAIL
