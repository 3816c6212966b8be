"""The rung registry: one declaration per rung, enumerated in ladder order."""
from __future__ import annotations

import pytest
import torch

import kernels
from kernels import registry

HEADINGS = ("Idea:", "Why faster:", "Expected bound:", "Limits:")


def test_gemm_ladder_order_and_ref_last():
    ladder = kernels.variants("gemm")
    numbers = [r.rung for r in ladder[:-1]]
    assert numbers == sorted(numbers) and numbers[:3] == [0, 1, 2]
    assert ladder[-1].label == "ref" and ladder[-1].rung is None
    assert [r.label for r in kernels.variants("gemm", include_ref=False)] == [f"v{n}" for n in numbers]


@pytest.mark.parametrize("key", [2, "v2", "triton_tile", "v2 triton_tile"])
def test_get_by_number_label_or_name(key):
    assert kernels.get("gemm", key).rung == 2


def test_unknown_rung_and_op_are_clear_errors():
    with pytest.raises(KeyError, match="no rung 'v99'.*v0 simt_naive"):
        kernels.get("gemm", "v99")
    with pytest.raises(KeyError, match="unknown op 'conv'"):
        kernels.variants("conv")


def test_a_rung_cannot_register_twice(monkeypatch):
    monkeypatch.setitem(registry._RUNGS, "gemm", list(registry._RUNGS["gemm"]))
    with pytest.raises(ValueError, match="registered twice"):
        registry.rung(op="gemm", rung=2, name="again", backends=("interpreter",),
                      dtypes=(torch.float32,), interpreter=True, kind="triton")(lambda a, b: a @ b)


def test_unknown_backend_in_a_declaration_is_rejected():
    with pytest.raises(ValueError, match="unknown backends"):
        registry.rung(op="gemm", rung=50, name="x", backends=("rocm",), dtypes=(torch.float32,),
                      interpreter=True, kind="triton")


@pytest.mark.parametrize("op", kernels.ops())
def test_every_numbered_rung_documents_the_four_headings(op):
    for r in kernels.variants(op, include_ref=False):
        missing = [h for h in HEADINGS if h not in r.doc]
        assert not missing, f"{op} {r.title} docstring lacks {missing}"


@pytest.mark.parametrize("op", kernels.ops())
def test_every_rung_declares_what_it_supports(op):
    spec = kernels.spec(op)
    for r in kernels.variants(op):
        assert r.dtypes and set(r.dtypes) <= set(spec.dtypes), r.title
        assert r.backends <= set(kernels.backend.BACKENDS), r.title
        assert r.kind in ("simt", "triton", "library"), r.title
        assert (r.aot is not None) == (r.kind == "triton"), f"{r.title}: Triton rungs expose aot()"
