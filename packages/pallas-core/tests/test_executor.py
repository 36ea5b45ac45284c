"""The shared MLIR-on-NumPy executor (pallas.executor): plans, the rule table, the
upstream dialects' rules, and errors naming the op."""

from __future__ import annotations

import numpy as np
import pytest
from jax.interpreters import mlir
from jaxlib.mlir import ir

from pallas import executor as ex


class Machine:
    def __init__(self, nslots):
        self.env = [None] * nslots


def _run(text: str, *args, rules=ex.UPSTREAM, fn="f"):
    ctx = mlir.make_ir_context()
    ctx.allow_unregistered_dialects = True
    with ctx, ir.Location.unknown():
        module = ir.Module.parse(text)
        cc = ex.Compiler(module, rules)
        plan = cc.region(cc.funcs[fn].regions[0])
    m = Machine(cc.nslots)
    return ex.run(plan, m, m.env, list(args))


def _unary(op: str, src: str, dst: str, x):
    return _run(f"""
      func.func @f(%x: {src}) -> {dst} {{
        %r = {op} %x : {src} to {dst}
        return %r : {dst}
      }}""", x)[0]


def test_arith_and_scf_run_with_mlir_semantics():
    (r,) = _run("""
      func.func @f(%n: index) -> i32 {
        %c0 = arith.constant 0 : index
        %c1 = arith.constant 1 : index
        %z = arith.constant 0 : i32
        %s = scf.for %i = %c0 to %n step %c1 iter_args(%acc = %z) -> (i32) {
          %ii = arith.index_cast %i : index to i32
          %a = arith.addi %acc, %ii : i32
          scf.yield %a : i32
        }
        return %s : i32
      }""", 5)
    assert int(r) == 10 and np.asarray(r).dtype == np.int32


def test_i1_arithmetic_is_modulo_2_and_extends_to_minus_one():
    (r,) = _run("""
      func.func @f(%a: i1, %b: i1) -> i1 {
        %r = arith.addi %a, %b : i1
        return %r : i1
      }""", np.bool_(True), np.bool_(True))
    assert not bool(r)
    assert int(_unary("arith.extsi", "i1", "i32", np.bool_(True))) == -1
    assert int(_unary("arith.extui", "i1", "i32", np.bool_(True))) == 1
    assert bool(_unary("arith.trunci", "i32", "i1", np.int32(2))) is False


def test_float_to_int_saturates():
    x = np.asarray([1e10, -1e10, np.nan, 2.7], np.float32)
    r = _unary("arith.fptosi", "vector<4xf32>", "vector<4xi32>", x)
    np.testing.assert_array_equal(r, [2**31 - 1, -(2**31), 0, 2])


def test_an_unknown_op_is_unsupported_and_named():
    with pytest.raises(ex.ExecutorUnsupported, match="'toy.double'"):
        _run("""
          func.func @f(%x: i32) -> i32 {
            %r = "toy.double"(%x) : (i32) -> i32
            return %r : i32
          }""", np.int32(1))


def test_a_backend_table_adds_its_dialect_and_errors_name_the_op():
    ops = ex.OpRuleTable("toy executor", parent=ex.UPSTREAM)

    @ops.register("toy.double")
    def _double(op, compiler):
        dt = ex.dtype_of(op.results[0].type)
        return lambda m, x: (ex.cast(np.asarray(x) * 2, dt),)

    @ops.register("toy.fail")
    def _fail(op, compiler):
        def run(m, x):
            raise ex.ExecutorError("bad")
        return run

    text = """
      func.func @f(%x: i32) -> i32 {
        %r = "toy.double"(%x) : (i32) -> i32
        %s = arith.addi %r, %x : i32
        return %s : i32
      }
      func.func @g(%x: i32) -> i32 {
        %r = "toy.fail"(%x) : (i32) -> i32
        return %r : i32
      }"""
    assert int(_run(text, np.int32(7), rules=ops)[0]) == 21
    assert "toy.double" not in ex.UPSTREAM and "arith.addi" in ops
    with pytest.raises(ex.ExecutorError, match="bad") as e:
        _run(text, np.int32(7), rules=ops, fn="g")
    assert "executing op toy.fail" in e.value.__notes__


def test_rules_are_keyed_by_op_name():
    with pytest.raises(TypeError, match="op names"):
        ex.OpRuleTable("t").register("addi")
