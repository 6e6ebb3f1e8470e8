"""A repro for every failure: the port call that shows a failed check, written as a folder a port author runs alone.

While the suite runs, a `Tape` keeps the last few calls made to the port (the arguments exactly as the port received
them, copied, and the output the check got back). Where a check compares a port output with the reference's element
by element, it hands both and the allowed difference to `Collector.witness`; the comparison of a check furthest
beyond its bound becomes that check's `Evidence`. For a failed check with evidence, `write_repros` writes
<out>/repro/<check>/: inputs.npz (the arguments, the reference's output, the allowed difference, the port's output
during the check), call.json (the method, how to build the port, the exact commands) and repro.py
(parity/core/repro_script.py: imports numpy and the port only, calls the one method and exits 1 while it still fails).
A failure that shows only after a sequence of calls (the updates check's optimizer, the trajectory's ES loop) is a
`Replay` (`Collector.replay`): its steps from the start up to the first failing epoch, replayed by the same script.
A statistical failure of one call's output (the noise's scale) is a `Statistic`: the script calls the port afresh and
recomputes the statistic against its interval.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

from parity.core.tape import encode
from parity.core.verdict import FAIL, CheckResult

FOLDER = "repro"
MARKER = "call.json"          # a folder under <out>/repro holding it is ours to replace
SCRIPT = Path(__file__).with_name("repro_script.py")
TAPED = frozenset({"noise", "perturbed_linear", "shape_fitness", "gradient", "forward", "init_params", "actions"})
TAPED_TREE = frozenset({"shape_fitness", "perturbed_mm", "perturbed_tmm", "gradient", "init_params", "noise",
                        "forward", "update"})      # a tree port (noise and forward: the repro of a NaN or inf they return)
TAPED_TREE_TORCH = frozenset({"shape", "products", "grads", "init"})     # parity.tree.torch_side.TorchTree
KEEP = 16                     # calls kept on the tape: a check compares right after the calls it makes
# The checks that witness comparisons (both suites' names): the tape copies inputs only while one of them runs, so a
# trajectory's thousands of forward calls cost nothing.
WITNESSING = frozenset({"fitness", "products", "gradients", "updates", "actions", "init", "noise", "forward"})


class Call(NamedTuple):
    """One port call: what the port's method was given (copied at the call) and what the check got back."""

    method: str
    args: tuple
    kwargs: dict
    output: Any


class Evidence(NamedTuple):
    """A port output that differs from the reference's beyond the check's bound, and the call that produced it."""

    check: str
    label: str               # which case of the check (its Recorder row's size or leaf)
    call: Call
    path: tuple              # keys from the port's output to the compared array: ("0.weight",), ("update", "0.weight", 0)
    port: np.ndarray         # the compared array as the port returned it during the check
    reference: np.ndarray
    allowed: np.ndarray      # |port - reference| allowed, element by element (broadcasts against the output)
    why: str                 # where the bound comes from
    ratio: float             # max |port - reference| / allowed (inf where allowed is 0)


class Var(NamedTuple):
    """An argument of a replay's step that is an earlier step's output, by the name that step gave it."""

    name: str


class Step(NamedTuple):
    """One call of a replay, with the arguments exactly as the port's own method receives them (Var for an earlier
    output); `out` names what it returns ("" for nothing kept, a tuple of names to unpack a tuple)."""

    method: str
    args: tuple
    out: str | tuple = ""


def step(method: str, *args: Any, out: str | tuple = "") -> Step:
    """A Step with its arguments copied now, before the port is called (a port may write into its inputs)."""
    return Step(method, _copied(args), out)


class Replay(NamedTuple):
    """A failure seen only after a sequence of port calls (an optimizer's or an ES loop's epochs): the calls from the
    start up to the first failing epoch, and the named output compared ({key: array}) against the reference's."""

    check: str
    label: str
    steps: tuple             # Step, in order
    result: str              # the step output compared: {key: array}
    port: dict               # that output as the port returned it during the check
    reference: dict
    allowed: dict            # |port - reference| allowed per key, element by element
    why: str
    ratio: float
    paths: dict = {}         # key -> its path in the compared output, where not (key,): ("0.weight", 0) for A


class Statistic(NamedTuple):
    """A statistical failure of one port call's output: the values (the array at `path`, rows `rows`, over `divisor`)
    whose statistic fell outside its interval; the script recomputes it from the port's fresh output."""

    check: str
    label: str
    call: Call
    path: tuple
    rows: np.ndarray         # the rows (members) of the array the values come from
    divisor: float           # the values are those rows / divisor, flattened
    statistic: str           # "mean square" | "mean"
    value: float             # the statistic during the check
    interval: tuple          # (lo, hi): the statistic's acceptance interval at `alpha`
    alpha: float
    why: str
    port: np.ndarray         # the array at `path` as the port returned it during the check
    ratio: float = np.inf    # (evidence from a test has no margin: the first failing test is kept)


def _copied(value: Any) -> Any:
    """`value` with every numpy array copied, so a port that writes into its inputs cannot change the record."""
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_copied(v) for v in value)
    if isinstance(value, list):
        return [_copied(v) for v in value]
    if isinstance(value, dict):
        return {k: _copied(v) for k, v in value.items()}
    return value


def same(a: Any, b: Any) -> bool:
    """Whether two outputs hold the same arrays (a validated copy of a port's output is the same as the output)."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return set(a) == set(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.shape(a) == np.shape(b) and np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True)
    return a is b


class Tape:
    """The last KEEP calls of the taped methods made to one port (CheckedPort, or a RecordedPort, reports them)."""

    def __init__(self, keep: int = KEEP, methods: frozenset = TAPED):
        self.calls: collections.deque[Call] = collections.deque(maxlen=keep)
        self.methods = methods
        self.on = True

    def wants(self, method: str) -> bool:
        return self.on and method in self.methods

    def before(self, method: str, args: tuple, kwargs: dict) -> tuple:
        """What to keep of a call about to be made: the inputs, copied."""
        return method, _copied(args), _copied(kwargs)

    def after(self, pending: tuple, output: Any) -> None:
        self.calls.append(Call(*pending, output))

    def producing(self, output: Any) -> Call | None:
        """The latest kept call whose output is `output` (the very object the check got back), else the latest whose
        output holds the same arrays (the check got a validated copy)."""
        return (next((c for c in reversed(self.calls) if c.output is output), None)
                or next((c for c in reversed(self.calls) if same(c.output, output)), None))


class RecordedPort:
    """`target` with each call of a method its tape wants recorded (inputs copied first); all else passes through.
    Wraps a tree port under parity.tree.adapter.CheckedTreePort, or the LM suite's torch side."""

    def __init__(self, target: Any, tape: Tape):
        self._target, self._tape = target, tape

    @property
    def wrapped(self) -> Any:
        """The port itself (its class names it in reports)."""
        return self._target

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if not (callable(attr) and self._tape.wants(name)):
            return attr

        def recorded(*args, **kwargs):
            pending = self._tape.before(name, args, kwargs)
            out = attr(*args, **kwargs)
            self._tape.after(pending, out)
            return out

        return recorded


def exceeds(port: Any, reference: Any, allowed: Any) -> np.ndarray:
    """Where |port - reference| > allowed (float64; NaN counts as beyond)."""
    diff = np.abs(np.asarray(port, np.float64) - np.asarray(reference, np.float64))
    return ~(diff <= np.asarray(allowed, np.float64))


def margin(port: Any, reference: Any, allowed: Any) -> float:
    """max |port - reference| / allowed over the elements beyond it (inf for a NaN or where nothing is allowed)."""
    diff = np.abs(np.asarray(port, np.float64) - np.asarray(reference, np.float64))
    allowed = np.broadcast_to(np.asarray(allowed, np.float64), diff.shape)
    beyond = ~(diff <= allowed)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.where(allowed[beyond] > 0, diff[beyond] / allowed[beyond], np.inf)
    return float(np.where(np.isnan(ratios), np.inf, ratios).max()) if ratios.size else 0.0


@dataclasses.dataclass
class Collector:
    """The tape and, per check, its worst failing comparison (the one the headline names, for most checks).
    `start(check)` before each check."""

    tape: Tape = dataclasses.field(default_factory=Tape)
    evidence: dict[str, Evidence] = dataclasses.field(default_factory=dict)
    check: str = ""

    def recorded(self, target: Any) -> "RecordedPort":
        """`target` with its calls on this collector's tape."""
        return RecordedPort(target, self.tape)

    def start(self, check: str) -> None:
        self.check = check
        self.tape.calls.clear()
        self.tape.on = check in WITNESSING

    def witness(self, label: str, produced: Any, port: Any, reference: Any, allowed: Any, why: str,
                path: tuple = ()) -> None:
        """Keep the running check's comparison that exceeds its bound the most, with the call behind it: `produced`
        is what the port call returned (as the check got it), `port` the array compared, found at `path` in the
        port's own output."""
        beyond = exceeds(port, reference, allowed)
        if not np.any(beyond):
            return
        ratio = margin(port, reference, allowed)
        kept = self.evidence.get(self.check)
        call = self.tape.producing(produced)
        if call is None or (kept is not None and kept.ratio >= ratio):
            return
        self.evidence[self.check] = Evidence(self.check, label, call, tuple(path), np.array(port),
                                             np.array(reference, np.float64),
                                             np.broadcast_to(np.asarray(allowed, np.float64), np.shape(port)).copy(),
                                             why, ratio)

    def keep(self, evidence: Evidence) -> None:
        """Make `evidence` the running check's, in place of any comparison it kept: a failure that stopped the check
        (a port output holding NaN or inf, parity.core.nonfinite)."""
        self.evidence[self.check] = evidence

    def replay(self, label: str, steps: Sequence[Step], result: str, port: Mapping, reference: Mapping,
               allowed: Mapping, why: str, paths: Mapping | None = None) -> None:
        """Keep the running check's first failing replay (the earliest epoch that fails: the shortest sequence);
        nothing when every key of `port` is within `allowed` of `reference`. `paths`: a key's path in the output
        named `result` where it is not (key,)."""
        if self.check in self.evidence:
            return
        ratio = max((margin(port[k], reference[k], allowed[k]) for k in reference), default=0.0)
        if ratio == 0.0:
            return
        self.evidence[self.check] = Replay(
            self.check, label, tuple(steps), result, {k: np.array(port[k]) for k in reference},
            {k: np.array(reference[k], np.float64) for k in reference},
            {k: np.broadcast_to(np.asarray(allowed[k], np.float64), np.shape(port[k])).copy() for k in reference},
            why, ratio, {k: tuple(v) for k, v in (paths or {}).items()})

    def statistic(self, label: str, produced: Any, path: tuple, rows: np.ndarray, divisor: float, statistic: str,
                  value: float, interval: tuple, alpha: float, why: str, array: np.ndarray) -> None:
        """Keep the running check's first failing statistical test when no element-wise comparison failed and the
        port call behind `produced` is on the tape."""
        call = self.tape.producing(produced)
        if self.check in self.evidence or call is None:
            return
        self.evidence[self.check] = Statistic(self.check, label, call, tuple(path), np.asarray(rows), float(divisor),
                                              statistic, float(value), tuple(map(float, interval)), float(alpha), why,
                                              np.array(array))


# ---------------------------------------------------------------- how the script builds the port
class Recipe(NamedTuple):
    """How repro.py builds the port: a `--port module:attr` (called with the run's config when a class or factory),
    or a built-in torch side: `factory(config_class(**config), resolve(spec, knobs), *extra)`."""

    kind: str                # "port" | "builtin"
    spec: str                # module:attr, or the torch side's profile
    knobs: tuple[str, ...]   # the torch side's KNOB=VALUE assignments
    config: dict             # the run's config (spec.config.Config or spec.lm.LMConfig), as fields
    path: str                # the sys.path entry that holds the port's module (repro.py appends it)
    builtin: tuple[str, ...] = ()    # "module:name" of the factory, the config class and the knob resolver
    extra: tuple = ()                # the factory's further arguments (the torch device)


def module_root(module_name: str) -> str:
    """The absolute sys.path entry a module is imported from (its file's folder, up one per dot of its name), found
    without importing it when it is not imported yet (a --port recipe is made before the port loads); '' for a module
    with no file (built in memory) or none found: its repro then needs it on PYTHONPATH."""
    module = sys.modules.get(module_name)
    file = getattr(module, "__file__", None) if module is not None else _spec_origin(module_name)
    if not file:
        return ""
    root = Path(file).resolve().parent
    depth = module_name.count(".") + (1 if Path(file).name == "__init__.py" else 0)
    for _ in range(depth):
        root = root.parent
    return str(root)


def _spec_origin(module_name: str) -> str | None:
    """The file importlib would load `module_name` from (its parent packages imported), or None."""
    import importlib.util
    try:
        spec = importlib.util.find_spec(module_name)
    except Exception:           # a parent that fails to import, a bad name: the port's loading says so
        return None
    return spec.origin if spec is not None and spec.has_location else None


def port_recipe(spec: str, cfg: Any) -> Recipe:
    """A --port's recipe: built with the run's config (cfg), or with no arguments when cfg is None (--task tree)."""
    return Recipe("port", spec, (), {} if cfg is None else dataclasses.asdict(cfg), module_root(spec.split(":", 1)[0]))


def torch_recipe(profile: str, knobs: Sequence[str], device: str, cfg: Any) -> Recipe:
    """The CartPole suite's torch side: parity.mlp.torch_side.TorchPort(Config, Knobs, device)."""
    return Recipe("builtin", profile, tuple(knobs), dataclasses.asdict(cfg), module_root("parity.mlp.torch_side"),
                  ("parity.mlp.torch_side:TorchPort", "spec.config:Config", "spec.knobs:resolve"), (device,))


def tree_torch_recipe(profile: str, knobs: Sequence[str], cfg: Any) -> Recipe:
    """The LM suite's torch side: parity.tree.torch_side.TorchTree(LMConfig, TreeKnobs)."""
    return Recipe("builtin", profile, tuple(knobs), dataclasses.asdict(cfg), module_root("parity.tree.torch_side"),
                  ("parity.tree.torch_side:TorchTree", "spec.lm:LMConfig", "spec.tree_knobs:resolve_tree"))


# ---------------------------------------------------------------- the folder
def _arrays_and_call(ev: Evidence) -> tuple[dict[str, np.ndarray], dict]:
    """The npz's arrays and the JSON structure of the call's arguments (parity.core.tape's encoding)."""
    arrays: dict[str, np.ndarray] = {}
    args = encode(list(ev.call.args), arrays)
    kwargs = encode(dict(ev.call.kwargs), arrays)
    arrays.update(reference=ev.reference, allowed=ev.allowed, port_during_check=ev.port)
    return arrays, {"method": ev.call.method, "path": list(ev.path), "args": args, "kwargs": kwargs}


def _replay_arrays_and_call(ev: Replay) -> tuple[dict[str, np.ndarray], dict]:
    """The npz's arrays and call.json's steps (Var as {"t": "var"}), result, reference, allowed, port's output."""
    arrays: dict[str, np.ndarray] = {}
    steps = [{"method": s.method, "out": list(s.out) if isinstance(s.out, tuple) else s.out,
              "args": [{"t": "var", "name": a.name} if isinstance(a, Var) else encode(a, arrays) for a in s.args]}
             for s in ev.steps]
    return arrays, {"steps": steps, "result": ev.result, "paths": {k: list(v) for k, v in ev.paths.items()},
                    "reference": encode(ev.reference, arrays),
                    "allowed": encode(ev.allowed, arrays), "port_during_check": encode(ev.port, arrays)}


def _statistic_arrays_and_call(ev: Statistic) -> tuple[dict[str, np.ndarray], dict]:
    """The npz's arrays (the call's arguments, the rows, the port's array during the check) and call.json's fields."""
    arrays: dict[str, np.ndarray] = {}
    args = encode(list(ev.call.args), arrays)
    kwargs = encode(dict(ev.call.kwargs), arrays)
    arrays.update(rows=ev.rows, port_during_check=ev.port)
    return arrays, {"method": ev.call.method, "path": list(ev.path), "args": args, "kwargs": kwargs,
                    "statistic": {"kind": ev.statistic, "divisor": ev.divisor.hex(), "value": ev.value,
                                  "interval": list(ev.interval), "alpha": ev.alpha}}


def describe(ev: Evidence | Replay | Statistic, encoded: dict, recipe: Recipe, command: str, folder: Path) -> dict:
    """call.json: what repro.py calls and how (a call, a replay's steps or a statistic's test: `encoded`), what is
    compared, and the commands (the suite's and the script's)."""
    return {"check": ev.check, "case": ev.label, "allowed_why": ev.why, **encoded, "port": recipe._asdict(),
            "suite_command": command, "repro_command": f"python {folder / 'repro.py'}"}


def write_one(folder: Path, ev: Evidence | Replay | Statistic, recipe: Recipe, command: str) -> Path:
    """Write one repro folder atomically (a temporary sibling renamed into place)."""
    encoder = (_replay_arrays_and_call if isinstance(ev, Replay) else
               _statistic_arrays_and_call if isinstance(ev, Statistic) else _arrays_and_call)
    arrays, encoded = encoder(ev)
    call = describe(ev, encoded, recipe, command, folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        np.savez_compressed(tmp / "inputs.npz", **arrays)
        (tmp / MARKER).write_text(json.dumps(call, indent=1) + "\n", encoding="utf-8")
        shutil.copyfile(SCRIPT, tmp / "repro.py")
        (tmp / "command.txt").write_text(
            f"# the suite run that failed:\n{command}\n# the failure alone (numpy and the port only):\n"
            f"{call['repro_command']}\n", encoding="utf-8")
        os.chmod(tmp, 0o755)
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


class Written(NamedTuple):
    """A failed check's repro: the folder written, or why there is none."""

    folder: str
    note: str


def write_repros(out: Path, verdicts: Mapping[str, str], evidence: Mapping[str, Evidence | Replay], recipe: Recipe,
                 command: str) -> dict[str, Written]:
    """Write <out>/repro/<check>/ for each failed check ({check: verdict}) with evidence and remove the ones an
    earlier run left for checks that do not fail now; {failed check: Written}."""
    base = Path(out) / FOLDER
    written = {}
    for name, verdict in verdicts.items():
        folder, ev = base / name, evidence.get(name)
        if verdict == FAIL and ev is not None:
            try:
                written[name] = Written(str(write_one(folder, ev, recipe, command)), "")
                continue
            except TypeError as err:          # an argument with no plain-data form (tape.encode)
                written[name] = Written("", f"the call's inputs cannot be stored ({err})")
        elif verdict == FAIL:
            written[name] = Written("", NO_EVIDENCE)
        if (folder / MARKER).is_file():
            shutil.rmtree(folder)
    if base.is_dir() and not any(base.iterdir()):
        base.rmdir()
    return written


def with_repros(out: Path, results: Sequence[CheckResult], evidence: Mapping[str, Evidence], recipe: Recipe,
                command: str) -> list[CheckResult]:
    """write_repros for the CartPole suite's results; each failed one with `repro` (the folder) or `repro_note`."""
    written = write_repros(out, {r.name: r.verdict for r in results}, evidence, recipe, command)
    return [dataclasses.replace(r, repro=written[r.name].folder, repro_note=written[r.name].note)
            if r.name in written else r for r in results]


NO_EVIDENCE = ("no single port call shows this failure against the reference's output (a statistical "
               "test other than the noise's scale, a structural reading, or a trajectory row other than its step "
               "and noise); the rows above say what was measured")
