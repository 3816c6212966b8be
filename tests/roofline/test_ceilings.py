"""Measured ceilings: never faked without a GPU; cached per GPU name; corrupt caches named.

workbench/__init__.py exists, so the module is imported as ``workbench.harness.ceilings``.
"""

import json

import pytest
import torch

import roofline
import workbench.harness.ceilings as ceilings

GPU = "AMD Instinct MI300X"
MEASURED = {"gpu": GPU, "date": "2026-11-30T10:00:00+00:00", "torch": "2.9.0",
            "hbm_tbps": 4.3, "peak_tflops": {"bf16": 710.5, "fp16": 720.0}}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_CACHE_DIR", str(tmp_path))
    return tmp_path / "ceilings"


def test_cache_dir_follows_the_environment(cache):
    assert ceilings.cache_dir() == cache
    assert ceilings.cache_path(GPU) == cache / "amd-instinct-mi300x.json"


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.delenv("WORKBENCH_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert ceilings.cache_dir() == tmp_path / ".cache" / "amd-kernel-workbench" / "ceilings"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_no_gpu_raises_instead_of_faking_numbers(cache):
    cache.mkdir()
    ceilings.cache_path(GPU).write_text(json.dumps(MEASURED), encoding="utf-8")
    with pytest.raises(RuntimeError, match="needs a GPU"):
        ceilings.measure_ceilings()
    assert sorted(p.name for p in cache.iterdir()) == ["amd-instinct-mi300x.json"]


def test_interpreter_raises_even_if_torch_sees_a_gpu(cache, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(RuntimeError, match="interpreter"):
        ceilings.measure_ceilings(force=True)


def test_hand_written_cache_file_round_trips(cache):
    cache.mkdir()
    ceilings.cache_path(GPU).write_text(json.dumps(MEASURED), encoding="utf-8")
    assert ceilings.load_cached_ceilings(GPU) == MEASURED
    assert ceilings.load_cached_ceilings("NVIDIA H200") is None


def test_save_then_load(cache):
    path = ceilings.save_ceilings(dict(MEASURED, peak_tflops={"bfloat16": 700}))
    assert path == ceilings.cache_path(GPU) and not list(cache.glob("*.tmp"))
    loaded = ceilings.load_cached_ceilings(GPU)
    assert loaded["peak_tflops"] == {"bf16": 700.0} and loaded["hbm_tbps"] == 4.3


def test_cached_ceilings_draw_on_the_roofline(cache):
    ceilings.save_ceilings(MEASURED)
    chart = roofline.chart("MI300X", ceilings=ceilings.load_cached_ceilings(GPU))
    kinds = {r["kind"] for layer in chart.to_dict()["layer"] if layer["name"] == "roofs"
             for r in layer["data"]["values"]}
    assert kinds == {"datasheet", "model", "measured"}


@pytest.mark.parametrize("content, match", [
    ("{not json", "not JSON"),
    (b"\xff\xfe\x00garbage", "not JSON"),
    (json.dumps([1, 2]), "expected a mapping"),
    (json.dumps(dict(MEASURED, hbm_tbps=-1)), "hbm_tbps must be a positive number"),
    (json.dumps(dict(MEASURED, peak_tflops={"bf16": "fast"})), "peak_tflops.bf16"),
    (json.dumps({k: v for k, v in MEASURED.items() if k != "date"}), "'date'"),
    (json.dumps(dict(MEASURED, gpu="NVIDIA H200")), "is for 'NVIDIA H200'"),
])
def test_corrupt_cache_is_a_clear_error(cache, content, match):
    cache.mkdir()
    path = ceilings.cache_path(GPU)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=match) as err:
        ceilings.load_cached_ceilings(GPU)
    assert str(path) in str(err.value) and "force=True" in str(err.value)


@pytest.mark.gpu
def test_measure_on_a_gpu(cache):
    measured = ceilings.measure_ceilings(force=True)
    assert measured["gpu"] == torch.cuda.get_device_name()
    assert measured["hbm_tbps"] > 0 and measured["peak_tflops"]["bf16"] > 0
    assert ceilings.load_cached_ceilings(measured["gpu"]) == measured
    assert ceilings.measure_ceilings() == measured          # served from the cache
