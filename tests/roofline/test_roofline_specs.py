"""The built-in GPU data: complete, sourced, flagged where the reference doubts it."""

from importlib.resources import files

import pytest
import yaml

import roofline

BUILT_IN = ["B200", "H100 SXM", "H200 SXM", "MI250X", "MI300X", "MI325X", "MI355X"]


def test_known_gpus_are_the_seven_researched_ones():
    assert roofline.gpus() == BUILT_IN


def test_spec_files_are_package_data():
    names = sorted(f.name for f in files("roofline").joinpath("specs").iterdir()
                   if f.name.endswith(".yaml"))
    assert len(names) == len(BUILT_IN)
    assert files("roofline").joinpath("sources.yaml").is_file()


@pytest.mark.parametrize("alias, name", [
    ("MI300X", "MI300X"), ("mi300x", "MI300X"), ("AMD Instinct MI300X", "MI300X"),
    ("H100", "H100 SXM"), ("h100 sxm", "H100 SXM"), ("H100-SXM5", "H100 SXM"),
    ("H200", "H200 SXM"), ("b200", "B200"), ("mi355x", "MI355X"),
])
def test_aliases(alias, name):
    assert roofline.spec(alias).name == name


# Device names as torch.cuda.get_device_name gives them (what results rows and the backend hold).
@pytest.mark.parametrize("device, target, units, name", [
    ("NVIDIA H200", "sm_90", 132, "H200 SXM"), ("NVIDIA H100 80GB HBM3", "sm_90", 132, "H100 SXM"),
    ("AMD Instinct MI300X VF", "gfx942", 304, "MI300X"), ("AMD Instinct MI355X", "gfx950", 256, "MI355X"),
])
def test_device_names_resolve_to_their_specs(device, target, units, name):
    assert roofline.device_spec(device).name == name                   # a results row's name alone
    assert roofline.device_spec(device, target).name == name           # ... on its target
    assert roofline.device_spec(device, target, units).name == name    # this process's GPU


def test_a_device_name_must_agree_with_its_target_and_units_else_target_and_units_decide():
    with pytest.raises(KeyError, match="unknown GPU 'NVIDIA H100 80GB HBM3' on gfx942"):
        roofline.device_spec("NVIDIA H100 80GB HBM3", "gfx942")
    with pytest.raises(KeyError, match="on sm_90 with 114 compute units"):   # the PCIe part: not the SXM's spec
        roofline.device_spec("NVIDIA H100 PCIe", "sm_90", 114)
    assert roofline.device_spec("a name roofline lacks", "gfx942", 304).name == "MI300X"   # the first by name
    with pytest.raises(KeyError, match="'MI300X' names MI300X .gfx942, 304 compute units., which disagrees"):
        roofline.device_spec("MI300X", "sm_90", 132)   # a spec's own name is checked too
    with pytest.raises(KeyError, match="disagrees with gfx942"):
        roofline.device_spec("H200", "gfx942")
    with pytest.raises(KeyError, match="unknown GPU 'NVIDIA A100-SXM4-80GB'; known: B200"):
        roofline.device_spec("NVIDIA A100-SXM4-80GB")


def test_unknown_gpu_lists_known_names():
    with pytest.raises(KeyError) as err:
        roofline.spec("MI999X")
    assert "MI999X" in str(err.value) and "MI300X" in str(err.value)


# A few headline numbers pinned against gpu-specs.md, so an edit to the data is deliberate.
@pytest.mark.parametrize("name, bf16, hbm, target, cus", [
    ("MI250X", 383.0, 3.2768, "gfx90a", 220),
    ("MI300X", 1307.4, 5.3, "gfx942", 304),
    ("MI325X", 1307.4, 6.0, "gfx942", 304),
    ("MI355X", 2516.6, 8.0, "gfx950", 256),
    ("H100 SXM", 989.4, 3.35, "sm_90", 132),
    ("H200 SXM", 989.4, 4.8, "sm_90", 132),
    ("B200", 2250.0, 8.0, "sm_100", 148),
])
def test_headline_numbers(name, bf16, hbm, target, cus):
    s = roofline.spec(name)
    assert (s.peak_tflops["bf16"], s.hbm_tbps, s.target, s.compute_units) == \
        (bf16, hbm, target, cus)


@pytest.mark.parametrize("name, dtype", [
    ("MI250X", "fp8"), ("MI250X", "tf32"), ("MI300X", "fp4"), ("MI355X", "tf32"),
    ("H100 SXM", "fp4"), ("H200 SXM", "fp6"),
])
def test_unsupported_dtypes_are_none(name, dtype):
    assert roofline.spec(name).peak_tflops[dtype] is None


def test_fp8_formats_distinguish_fnuz_from_ocp():
    assert roofline.spec("MI300X").formats["fp8"] == "e4m3fnuz/e5m2fnuz"
    assert roofline.spec("MI325X").formats["fp8"] == "e4m3fnuz/e5m2fnuz"
    assert roofline.spec("MI355X").formats["fp8"] == "e4m3fn/e5m2"
    assert roofline.spec("H100 SXM").formats["fp8"] == "e4m3fn/e5m2"
    assert roofline.spec("MI355X").formats["fp4"].startswith("mxfp4")
    assert roofline.spec("MI300X").formats["tf32"] == "xf32"


def test_vector_and_matrix_peaks_differ_where_the_reference_says():
    s = roofline.spec("MI300X")
    assert (s.peak_tflops["fp64"], s.peak_tflops_vector["fp64"]) == (163.4, 81.7)
    assert roofline.spec("H100 SXM").peak_tflops_vector["fp16"] == 133.8


@pytest.mark.parametrize("name", BUILT_IN)
def test_every_number_has_a_resolvable_source(name):
    s = roofline.spec(name)
    numbers = ["wave_size", "compute_units", "clock_ghz"] + \
        [f"peak_tflops.{d}" for d in roofline.DTYPES] + \
        [f"bandwidth_tbps.{lvl}" for lvl in s.memory_levels]
    for field in numbers:
        tags = s.provenance[field].source
        assert tags and all(t in s.sources for t in tags), field
    assert all(s.sources[t] for t in s.sources)


@pytest.mark.parametrize("name, field", [
    ("B200", "peak_tflops.fp64"), ("B200", "bandwidth_tbps.hbm"), ("B200", "capacity.l2_mib"),
    ("H200 SXM", "clock_ghz"), ("MI355X", "bandwidth_tbps.lds"), ("MI300X", "bandwidth_tbps.l2"),
])
def test_uncertain_values_stay_flagged(name, field):
    assert roofline.spec(name).uncertain[field]


def test_mi355x_llc_is_rocm_tables_256_mib_not_flagged():
    """ROCm's GPU specifications table (S1) lists MI355X's L3 (Infinity Cache) at 256 MiB."""
    s = roofline.spec("MI355X")
    assert s.llc_mib == 256 and "capacity.llc_mib" not in s.uncertain
    assert "S1" in s.provenance["capacity.llc_mib"].source and "gpu-specs" in s.sources["S1"]


def test_formula_numbers_are_marked_derived():
    s = roofline.spec("MI300X")
    assert "bandwidth_tbps.lds" in s.derived
    assert "bandwidth_tbps.hbm" not in s.derived and "peak_tflops.bf16" not in s.derived


def test_memory_levels_are_ordered_slowest_first():
    for name in BUILT_IN:
        bws = list(roofline.spec(name).memory_levels)
        assert bws[0] == "hbm"
        assert bws == [lvl for lvl in roofline.LEVELS if lvl in bws]


def test_spec_is_read_only():
    s = roofline.spec("MI300X")
    with pytest.raises(AttributeError):
        s.name = "x"
    with pytest.raises(TypeError):
        s.peak_tflops["bf16"] = 1.0


def test_sources_file_tags_are_unique_and_titled():
    data = yaml.safe_load(files("roofline").joinpath("sources.yaml").read_text("utf-8"))
    assert all(entry.get("title") for entry in data.values())
    assert {"S1", "S2", "S7b", "S28", "G1"} <= set(data)
