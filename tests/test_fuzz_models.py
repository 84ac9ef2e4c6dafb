"""Damaged model files: `edgepack inspect` and `edgepack simplify` on mutated bytes of small
valid models (bit flips, truncation, inserted and overwritten junk) either work (exit 0) or say
what is wrong in one line (exit 2): never exit 3, never a traceback, never a hang.

Fixed seeds: case N is the same bytes on every run. EDGEPACK_FUZZ_CASES sets how many
(`make fuzz` runs 5000); a failure names the case, its mutation and a copy of its bytes.
"""

import faulthandler
import json
import os
import random
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from conftest import embed_model
from packager.cli import main

pytestmark = pytest.mark.fuzz
CASES = int(os.environ.get("EDGEPACK_FUZZ_CASES", "300"))
SEED = 20240611
HANG_S = 120   # one command on a model this small takes milliseconds


def conv_model() -> bytes:
    """Conv -> Relu -> GlobalAveragePool -> Flatten -> MatMul, dynamic batch."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=(4, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(np.zeros(4, np.float32), "b"),
             numpy_helper.from_array(rng.normal(size=(4, 5)).astype(np.float32), "g")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["p"], name="gap"),
             helper.make_node("Flatten", ["p"], ["f"], name="flat"),
             helper.make_node("MatMul", ["f", "g"], ["y"], name="mm")]
    graph = helper.make_graph(
        nodes, "fuzz", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model.SerializeToString()


def mutate(data: bytes, case: int) -> tuple[bytes, str]:
    """Case *case*'s damaged copy of *data*, and what was done to it."""
    rand = random.Random(SEED * 1_000_003 + case)
    buf = bytearray(data)
    kind = rand.choice(["flip", "flip", "truncate", "insert", "overwrite", "duplicate"])
    pos = rand.randrange(len(buf))
    if kind == "flip":
        bits = [(rand.randrange(len(buf)), rand.randrange(8)) for _ in range(rand.randint(1, 8))]
        for at, bit in bits:
            buf[at] ^= 1 << bit
        what = f"flip bits {bits}"
    elif kind == "truncate":
        del buf[pos:]
        what = f"truncate to {pos} bytes"
    elif kind == "insert":
        junk = bytes(rand.randrange(256) for _ in range(rand.randint(1, 32)))
        buf[pos:pos] = junk
        what = f"insert {junk.hex()} at {pos}"
    elif kind == "overwrite":
        junk = bytes(rand.randrange(256) for _ in range(rand.randint(1, 16)))
        buf[pos:pos + len(junk)] = junk
        what = f"overwrite {junk.hex()} at {pos}"
    else:
        size = rand.randint(1, 64)
        buf[pos:pos] = buf[rand.randrange(len(buf)):][:size]
        what = f"duplicate {size} bytes at {pos}"
    return bytes(buf), what


def check(args: list[str], capfd) -> str | None:
    """Run one command in-process; None if it behaved, else what went wrong."""
    result = CliRunner().invoke(main, args)
    printed = capfd.readouterr()   # what C++ libraries wrote to the real stdout/stderr
    text = result.output + printed.out + printed.err
    if result.exit_code not in (0, 2):
        return f"exit {result.exit_code}: {text.strip()[-300:]}"
    if "Traceback" in text or "unexpected" in text:
        return f"traceback or unexpected: {text.strip()[-300:]}"
    if result.exit_code == 2:
        errors = [ln for ln in result.stderr.splitlines() if ln.startswith("error: ")]
        if len(errors) != 1:
            return f"{len(errors)} error lines: {result.stderr.strip()[-300:]}"
        if "-o" in args and Path(args[args.index("-o") + 1]).exists():
            return "refused, but wrote the output"
    elif "--json" in args:
        try:
            json.loads(result.stdout)
        except ValueError:
            return f"--json printed no JSON: {result.stdout[:200]!r}"
    return None


def test_damaged_models_exit_0_or_2(tmp_path, capfd):
    sources = [conv_model(), embed_model(tmp_path / "embed.onnx").read_bytes()]
    findings = []
    try:
        for case in range(CASES):
            data, what = mutate(sources[case % len(sources)], case)
            model = tmp_path / f"case{case}.onnx"
            model.write_bytes(data)
            out = tmp_path / f"case{case}.simplified.onnx"
            for args in (["inspect", str(model)], ["inspect", str(model), "--json"],
                         ["simplify", str(model), "-o", str(out)]):
                faulthandler.dump_traceback_later(HANG_S, exit=True)   # a hang: where, then out
                problem = check(args, capfd)
                if problem is None and args[0] == "simplify" and out.exists():
                    problem = None if onnx.load(str(out)).graph.node else "empty output"
                if problem is not None:
                    keep = tmp_path.parent / f"fuzz-case{case}.onnx"
                    keep.write_bytes(data)
                    findings.append(f"case {case} ({what}), {args[0]}: {problem} [bytes: {keep}]")
            model.unlink()
            out.unlink(missing_ok=True)
    finally:
        faulthandler.cancel_dump_traceback_later()
    assert not findings, f"{len(findings)} of {CASES} cases misbehaved:\n" + "\n".join(findings[:20])
