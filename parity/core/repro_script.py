"""Repro of one failed parity check: calls the port's method on the stored inputs and compares with the reference.

Written by `python -m parity check` beside its report as <report>/repro/<check>/repro.py, with inputs.npz and
call.json. It imports numpy and the port only (no parity suite, no JAX): edit the port and run it again.
    python repro.py        exit 1 while the port's output still differs beyond the allowed difference, 0 once not
A statistical failure (call.json's "statistic") calls the port afresh and recomputes the statistic against its
interval. A failure seen only after several calls (an optimizer's or an ES loop's epochs) is replayed: call.json's "steps",
each one of the port's methods on the stored inputs and earlier steps' outputs, then the named output compared.
"""
import dataclasses
import importlib
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def decode(node, arrays, other=None):
    """The arguments from call.json's structure (parity.core.tape's encoding, whose own decode is this one) and the npz's
    arrays. other(node), where given, rebuilds the kinds only a recording holds (parity.core.tape's tokens, raised
    errors), at any depth."""
    kind = node["t"]
    if kind == "none":
        return None
    if kind in ("bool", "int", "str"):
        return node["v"]
    if kind == "float":
        return float.fromhex(node["v"])
    if kind == "array":
        return arrays[node["k"]]
    if kind == "scalar":
        return arrays[node["k"]][()]
    if kind == "dict":
        return {k: decode(v, arrays, other) for k, v in node["items"]}
    if kind in ("tuple", "list"):
        items = [decode(v, arrays, other) for v in node["items"]]
        return tuple(items) if kind == "tuple" else items
    if other is not None:
        return other(node)
    raise ValueError(f"call.json: cannot rebuild an argument of kind {kind!r}")


def config_class(fields):
    """A stand-in for the suite's spec.config.Config (its fields with the run's values, `sizes`, `replace`), for a
    port that is a class or factory of it."""
    namespace = {"replace": lambda c, **changes: dataclasses.replace(c, **changes)}
    if "hidden" in fields:          # CartPole's MLP widths
        namespace["sizes"] = property(lambda c: [4] + [c.hidden] * (c.layers - 1) + [2])
    return dataclasses.make_dataclass(
        "Config", [(name, type(value), dataclasses.field(default=value)) for name, value in fields.items()],
        frozen=True, namespace=namespace)


def load(spec):
    module_name, attr = spec.split(":", 1)
    return getattr(importlib.import_module(module_name), attr)


def build_port(recipe):
    """The port as the suite built it: `module:attr` (called with the run's config when a class or factory), or the
    project's torch side with its profile and knobs."""
    if recipe["path"]:
        sys.path.append(recipe["path"])     # after PYTHONPATH, so an edited copy of the port on PYTHONPATH wins
    if recipe["kind"] == "builtin":
        factory, config_class_, resolve = (load(s) for s in recipe["builtin"])
        return factory(config_class_(**recipe["config"]), resolve(recipe["spec"], recipe["knobs"]), *recipe["extra"])
    obj = load(recipe["spec"])
    if isinstance(obj, type) or (callable(obj) and not hasattr(obj, "noise")):
        obj = obj(config_class(recipe["config"])()) if recipe["config"] else obj()     # --task tree: no arguments
    return obj


def shown(value):
    """An argument in a few characters: an array's dtype and shape, a dict's keys, a scalar itself."""
    if isinstance(value, np.ndarray):
        return f"{value.dtype}{list(value.shape)}"
    if isinstance(value, dict):
        return "{" + ", ".join(map(str, value)) + "}"
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(shown(v) for v in value) + ")"
    return repr(value)


def as_float64(value):
    """A port's array (numpy, or a tensor with .detach()) in float64."""
    return np.asarray(value.detach().cpu() if hasattr(value, "detach") else value, np.float64)


def largest(diff):
    """max |port - reference| (NaN where the port gave NaN; 0 for no elements)."""
    return float(np.max(diff)) if diff.size else 0.0


def nonfinite(out):
    """'' for a finite output, else how many of its values are NaN or inf (the failure this repro shows)."""
    bad = int(np.sum(~np.isfinite(out)))
    return f" (the port's output holds NaN or inf at {bad} of {out.size} values)" if bad else ""


def run_steps(port, steps, arrays):
    """Call the port's methods in order; an argument {"t": "var"} is an earlier step's output by name.
    Returns {name: output}."""
    named = {}
    for s in steps:
        args = [named[a["name"]] if a["t"] == "var" else decode(a, arrays) for a in s["args"]]
        out = getattr(port, s["method"])(*args)
        if isinstance(s["out"], list):
            named.update(zip(s["out"], out))
        elif s["out"]:
            named[s["out"]] = out
    return named


def sequence(steps):
    """The methods called, in a few words: "optimizer_init(), optimizer_step() x2"."""
    runs = []
    for s in steps:
        if runs and runs[-1][0] == s["method"]:
            runs[-1][1] += 1
        else:
            runs.append([s["method"], 1])
    return ", ".join(f"{m}()" + (f" x{n}" if n > 1 else "") for m, n in runs)


def replay(call, arrays):
    """Replay the steps, compare the output named call["result"] key by key; 1 while any key is beyond."""
    port = build_port(call["port"])
    steps = call["steps"]
    got = run_steps(port, steps, arrays)[call["result"]]
    ref, allowed, during = (decode(call[k], arrays) for k in ("reference", "allowed", "port_during_check"))
    print(f"check {call['check']}, case {call['case']}: port {sequence(steps)} replayed, then its "
          f"{call['result']!r} compared key by key")
    beyond_total, size, moved, worst = 0, 0, False, None
    paths = call.get("paths", {})
    for key in ref:
        try:
            out = got
            for part in paths.get(key, [key]):
                out = out[part]
        except (KeyError, IndexError, TypeError):
            print(f"FAIL: the port's {call['result']!r} has no {key!r}; the reference's has {list(ref)}")
            return 1
        out = as_float64(out)
        if out.shape != ref[key].shape:
            print(f"FAIL: the port's {call['result']}[{key!r}] has shape {out.shape}; the reference's is "
                  f"{ref[key].shape}")
            return 1
        diff = np.abs(out - ref[key])
        beyond = ~(diff <= allowed[key])
        beyond_total, size = beyond_total + int(beyond.sum()), size + beyond.size
        moved = moved or not np.array_equal(out, during[key].astype(np.float64), equal_nan=True)
        if diff.size:
            ratio = np.where(np.isnan(diff), np.inf, diff / np.maximum(allowed[key], 1e-300))
            at = np.unravel_index(int(np.argmax(ratio)), diff.shape)
            if worst is None or ratio[at] > worst[0]:
                worst = (ratio[at], key, at, out[at], ref[key][at], diff[at], allowed[key][at])
        print(f"  {key}: max |port - reference| {largest(diff):.6g}{nonfinite(out)}, "
              f"{int(beyond.sum())} of {beyond.size} beyond")
    if worst is not None:
        _, key, at, o, r, d, a = worst
        print(f"  worst element {key}{tuple(int(i) for i in at)}: port {o:.9g}, reference {r:.9g}, |diff| {d:.6g}, "
              f"allowed {a:.6g}")
    print(f"  elements beyond the allowed difference: {beyond_total} of {size} (allowed: {call['allowed_why']})")
    if moved:
        print("  note: the port's output differs from what it returned during the check (edited, or not deterministic)")
    print("FAIL: the port still differs from the reference" if beyond_total else "PASS: within the allowed difference")
    return 1 if beyond_total else 0


def recompute(call, arrays):
    """A statistical failure: call the port afresh, take the same rows / divisor of the same array, recompute the
    statistic; 1 while it is outside its interval."""
    test = call["statistic"]
    args, kwargs = decode(call["args"], arrays), decode(call["kwargs"], arrays)
    out = getattr(build_port(call["port"]), call["method"])(*args, **kwargs)
    for key in call["path"]:
        out = out[key]
    out = as_float64(out)
    rows, divisor = arrays["rows"], float.fromhex(test["divisor"])
    if out.shape[1:] != arrays["port_during_check"].shape[1:] or out.shape[0] <= rows.max(initial=0):
        print(f"FAIL: port {call['method']}() returned shape {out.shape}; during the check "
              f"{arrays['port_during_check'].shape}")
        return 1
    values = out[rows].ravel() / divisor
    value = float(np.mean(values ** 2) if test["kind"] == "mean square" else np.mean(values))
    lo, hi = test["interval"]
    what = call["method"] + "()" + "".join(f"[{key!r}]" for key in call["path"])
    print(f"check {call['check']}, case {call['case']}: port {what} afresh, rows {rows.size} / {divisor:.6g}")
    print(f"  inputs (inputs.npz): {', '.join(shown(a) for a in args)}")
    print(f"  {test['kind']} of {values.size} values: {value:.6g}; allowed [{lo:.6g}, {hi:.6g}] "
          f"({call['allowed_why']}); during the check {test['value']:.6g}")
    if not np.array_equal(out, arrays["port_during_check"].astype(np.float64), equal_nan=True):
        print("  note: the port's draws differ from those during the check (edited, or drawn afresh)")
    ok = lo <= value <= hi
    print("PASS: the statistic is within its interval" if ok else "FAIL: the statistic is still outside its interval")
    return 0 if ok else 1


def main():
    call = json.loads((HERE / "call.json").read_text())
    with np.load(HERE / "inputs.npz", allow_pickle=False) as npz:
        arrays = {name: npz[name] for name in npz.files}
    if "steps" in call:
        return replay(call, arrays)
    if "statistic" in call:
        return recompute(call, arrays)
    args, kwargs = decode(call["args"], arrays), decode(call["kwargs"], arrays)
    port = build_port(call["port"])
    out = getattr(port, call["method"])(*args, **kwargs)
    for key in call["path"]:            # from the port's output to the compared array
        out = out[key]
    out = np.asarray(out.detach().cpu() if hasattr(out, "detach") else out, np.float64)
    ref, allowed = arrays["reference"], arrays["allowed"]
    if out.shape != ref.shape:
        print(f"FAIL: port {call['method']}() returned shape {out.shape}; the reference's is {ref.shape}")
        return 1
    diff = np.abs(out - ref)
    beyond = ~(diff <= allowed)
    worst = np.unravel_index(int(np.nanargmax(np.where(np.isnan(diff), np.inf, diff / np.maximum(allowed, 1e-300)))),
                             diff.shape) if diff.size else ()
    what = call["method"] + "()" + "".join(f"[{key!r}]" for key in call["path"])
    print(f"check {call['check']}, case {call['case']}: port {what}, output shape {out.shape}")
    print(f"  inputs (inputs.npz): {', '.join(shown(a) for a in args)}")
    print(f"  max |port - reference|  {largest(diff):.6g}{nonfinite(out)}")
    if diff.size:
        print(f"  worst element {tuple(int(i) for i in worst)}: port {out[worst]:.9g}, reference {ref[worst]:.9g}, "
              f"|diff| {diff[worst]:.6g}, allowed {allowed[worst]:.6g}")
    print(f"  elements beyond the allowed difference: {int(beyond.sum())} of {beyond.size} "
          f"(allowed: {call['allowed_why']})")
    if not np.array_equal(out, arrays["port_during_check"].astype(np.float64), equal_nan=True):
        print("  note: the port's output differs from what it returned during the check (edited, or not deterministic)")
    print("FAIL: the port still differs from the reference" if beyond.any() else "PASS: within the allowed difference")
    return 1 if beyond.any() else 0


if __name__ == "__main__":
    sys.exit(main())
