"""mxfp8's e8m0 scale rule is chosen per conversion (``kernels.fp8.convert(..., scale_rule=)``) and
carried by the converted layers, dense and MoE (the single-process and the expert-parallel one),
not set on the process-wide recipe: two models converted with different rules in one process,
run interleaved, quantize every operand (forward and backward) with their own rule; the results
are those of the functional op with that rule. Bad rules, a rule for a recipe without e8m0
scales and the old process-wide assignment are refused with a clear error."""
from __future__ import annotations

import copy

import pytest
import torch

import kernels
import kernels.fp8
from kernels.fp8 import fp8_linear
from kernels.gemm_fp8 import quantize_kernel
from kernels.moe.fp8_layer import Float8MoE
from kernels.moe.grouped_gemm_fp8 import grouped_gemm_fp8_train
from kernels.moe.grouped_gemm_fp8 import quantize_kernel as grouped_quantize_kernel

pytestmark = pytest.mark.skipif(bool(kernels.fp8.get("mxfp8").needs), reason=str(kernels.fp8.get("mxfp8").needs))

FP8 = torch.float8_e4m3fn
DIM, HIDDEN, EXPERTS, TOP_K, TOKENS = 32, 64, 4, 2, 9


@pytest.fixture
def rules(monkeypatch):
    """The e8m0 rule of every MX quantization launched (the dense fused cast's and the grouped one's)."""
    seen = []
    dense, grouped = quantize_kernel.launch, grouped_quantize_kernel.mx_launch
    # the dense launch's arguments end in scale_rule, preshuffled
    monkeypatch.setattr(quantize_kernel, "launch", lambda *a: seen.append(a[-2]) or dense(*a))
    monkeypatch.setattr(grouped_quantize_kernel, "mx_launch", lambda *a: seen.append(a[-1]) or grouped(*a))
    return seen


def _step(model, x, dy, rules):
    """Forward and backward: the rules of their quantizations, and the output."""
    start = len(rules)
    out = model(x.clone().requires_grad_())
    out.backward(dy)
    return rules[start:], out


def _models(make, rule_a, rule_b, **keep):
    torch.manual_seed(0)
    model = make()
    return (kernels.fp8.convert(copy.deepcopy(model), "mxfp8", scale_rule=rule_a, **keep),
            kernels.fp8.convert(copy.deepcopy(model), "mxfp8", scale_rule=rule_b, **keep))


def test_two_dense_models_quantize_with_their_own_rules(rules):
    a, b = _models(lambda: torch.nn.Sequential(torch.nn.Linear(DIM, HIDDEN), torch.nn.Linear(HIDDEN, DIM)),
                   None, "ocp", keep_high_precision=())
    assert [m.scale_rule for m in a] == ["round_up"] * 2 and [m.scale_rule for m in b] == ["ocp"] * 2
    assert "scale_rule=ocp" in repr(b)
    g = torch.Generator().manual_seed(1)
    x, dy = torch.randn(TOKENS, DIM, generator=g) * 30, torch.randn(TOKENS, DIM, generator=g)
    for _ in range(2):   # interleaved, each twice
        for model, rule in ((a, "round_up"), (b, "ocp")):
            seen = _step(model, x, dy, rules)[0]
            assert seen == [rule] * 6, (rule, seen)   # per layer: x and w forward, dy backward
    one = a[0]
    for rule in ("round_up", "ocp"):   # the first layer's output as the functional op's with the rule
        want = fp8_linear(x, one.weight, "mxfp8", FP8, scale_rule=rule) + one.bias
        assert torch.equal(a[0](x) if rule == "round_up" else b[0](x), want)
    assert not torch.equal(a[0](x), b[0](x))   # the rules differ on these operands


def _moe_with_rule_checks(model, rule, x, dy, rules):
    seen, out = _step(model, x, dy, rules)
    assert seen and set(seen) == {rule}, (rule, seen)
    return out


def test_two_moe_models_quantize_with_their_own_rules(rules):
    a, b = _models(lambda: kernels.MoE(DIM, HIDDEN, EXPERTS, TOP_K), None, "ocp")
    assert isinstance(a, Float8MoE) and (a.scale_rule, b.scale_rule) == ("round_up", "ocp")
    g = torch.Generator().manual_seed(2)
    x, dy = torch.randn(TOKENS, DIM, generator=g) * 30, torch.randn(TOKENS, DIM, generator=g)
    out_a = _moe_with_rule_checks(a, "round_up", x, dy, rules)
    out_b = _moe_with_rule_checks(b, "ocp", x, dy, rules)
    again = _moe_with_rule_checks(a, "round_up", x, dy, rules)
    assert torch.equal(again, out_a) and not torch.equal(out_a, out_b)   # the rules differ on these operands


def test_the_expert_parallel_layer_keeps_its_rule(rules, one_rank):
    torch.manual_seed(0)
    ep = kernels.MoE.from_full(kernels.MoE(DIM, HIDDEN, EXPERTS, TOP_K), one_rank)
    ocp = kernels.fp8.convert(ep, "mxfp8", scale_rule="ocp")
    dense = kernels.fp8.convert(torch.nn.Linear(DIM, DIM), "mxfp8")   # the default, in the same process
    g = torch.Generator().manual_seed(3)
    x, dy = torch.randn(TOKENS, DIM, generator=g), torch.randn(TOKENS, DIM, generator=g)
    assert ocp.fp8_dispatch and ocp.scale_rule == "ocp"
    _moe_with_rule_checks(ocp, "ocp", x, dy, rules)   # the senders' FP8 dispatch too
    assert _step(dense, x, dy, rules)[0] == ["round_up"] * 3


def test_a_bad_rule_or_a_rule_for_a_recipe_without_one_is_refused():
    linear, moe = torch.nn.Linear(DIM, DIM), kernels.MoE(DIM, HIDDEN, EXPERTS, TOP_K)
    with pytest.raises(ValueError, match="'mxfp8' takes scale_rule 'round_up' or 'ocp', got 'ceil'"):
        kernels.fp8.convert(linear, "mxfp8", scale_rule="ceil")
    for recipe in ("rowwise", "tensorwise", "delayed", "blockwise"):
        with pytest.raises(ValueError, match=f"recipe '{recipe}' has none"):
            kernels.fp8.convert(torch.nn.Sequential(linear, moe), recipe, scale_rule="ocp")
    assert type(moe) is kernels.MoE and isinstance(linear, torch.nn.Linear)   # nothing swapped
    with pytest.raises(ValueError, match="recipe 'rowwise' has none"):
        Float8MoE.from_moe(moe, "rowwise", scale_rule="round_up")
    with pytest.raises(ValueError, match="recipe 'rowwise' has none"):
        fp8_linear(torch.randn(2, DIM), linear.weight, "rowwise", scale_rule="ocp")
    with pytest.raises(ValueError, match="recipe 'rowwise' has none"):
        grouped_gemm_fp8_train(torch.randn(2, DIM), moe.gate, torch.tensor([1, 2, 2, 2], dtype=torch.int32),
                               "rowwise", scale_rule="ocp")
    with pytest.raises(AttributeError, match=r"chosen per conversion: kernels.fp8.convert\(model, 'mxfp8', "
                                             r"scale_rule='ocp'\)"):
        kernels.fp8.get("mxfp8").scale_rule = "ocp"
    assert kernels.fp8.get("mxfp8").scale_rule == "round_up"
    assert kernels.fp8.get("mxfp8", "ocp") is kernels.fp8.get("mxfp8", "ocp")   # one instance per rule
