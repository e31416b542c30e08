"""Tests for `xgbuild.hw`: the shipped `hw/*.toml` profiles and the loader's validation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from xgbuild import hw
from xgbuild.settings import REPO_ROOT, Settings

HW_DIR = REPO_ROOT / "hw"
EXPECTED = ["A100", "B200", "GB200", "H100", "H200", "L40S", "RTX4090"]
TB = 1e12


def all_profiles() -> list[hw.GpuProfile]:
    return [hw.load_profile(name, HW_DIR) for name in hw.known_targets(HW_DIR)]


# --- the shipped profiles ------------------------------------------------------------------------


def test_known_targets_are_the_canonical_names_sorted():
    assert hw.known_targets(HW_DIR) == EXPECTED


def test_default_dir_is_the_built_in_one_and_settings_default_to_it(monkeypatch, tmp_path):
    assert Settings.from_env({}).hw_dir == HW_DIR
    assert Settings.from_env({"XG_HW_DIR": str(tmp_path)}).hw_dir == tmp_path
    # The loader never reads the environment: the entry points pass Settings.hw_dir down.
    monkeypatch.setenv("XG_HW_DIR", str(tmp_path / "nowhere"))
    assert hw.known_targets() == EXPECTED
    assert hw.load_profile("H100") is hw.load_profile("H100", HW_DIR)


@pytest.mark.parametrize("name", EXPECTED)
def test_every_profile_loads_with_typed_fields(name):
    p = hw.load_profile(name, HW_DIR)
    assert p.name == name and p.vendor == "nvidia" and p.warp_size == 32
    assert p.max_registers_per_thread == 255
    assert p.registers_per_sm == 65536
    for value in (p.sm_count, p.l2_bytes, p.hbm_bytes, p.clock_boost_mhz, p.interconnect.pcie_gen):
        assert type(value) is int and value > 0
    for value in (p.hbm_bandwidth_bytes_per_s, p.peak_flops.fp32,
                  p.interconnect.bandwidth_bytes_per_s, p.interconnect.pcie_bandwidth_bytes_per_s):
        assert type(value) is float and value > 0


@pytest.mark.parametrize("profile", all_profiles(), ids=EXPECTED)
def test_arch_matches_compute_capability(profile):
    major, minor = profile.compute_capability
    assert profile.arch == f"sm_{major}{minor}"
    assert profile.sm == major * 10 + minor


def test_archs_are_the_published_ones():
    archs = {p.name: p.arch for p in all_profiles()}
    assert archs == {"A100": "sm_80", "B200": "sm_100", "GB200": "sm_100", "H100": "sm_90",
                     "H200": "sm_90", "L40S": "sm_89", "RTX4090": "sm_89"}


@pytest.mark.parametrize("path", sorted(HW_DIR.glob("*.toml")), ids=lambda p: p.name)
def test_every_value_has_a_source(path):
    data = tomllib.loads(path.read_text())
    sources = data["sources"]
    leaves = [k for k, v in data.items() if not isinstance(v, dict) and k not in ("name", "aliases")]
    for table in ("peak_flops", "interconnect", "measured"):
        leaves += [f"{table}.{k}" for k in data.get(table, {})]
    assert sorted(sources) == sorted(leaves)
    assert all(isinstance(s, str) and len(s) > 10 for s in sources.values())
    assert dict(hw.load_profile(data["name"], HW_DIR).sources) == sources


def test_missing_fp8_is_zero_and_explained():
    a100 = hw.load_profile("A100", HW_DIR)
    assert a100.peak_flops.fp8 == 0.0
    assert "no FP8" in a100.sources["peak_flops.fp8"]
    with pytest.raises(ValueError, match="A100 has no fp8"):
        a100.peak_flops_for("float8")


def test_estimates_say_so():
    gb200 = hw.load_profile("GB200", HW_DIR)
    assert "estimate" in gb200.sources["l2_bytes"]
    assert "derived" in gb200.sources["clock_boost_mhz"]
    assert "/ 72" in gb200.sources["hbm_bandwidth_bytes_per_s"]


@pytest.mark.parametrize("profile", all_profiles(), ids=EXPECTED)
def test_sanity_ranges(profile):
    p, peaks = profile, profile.peak_flops
    assert 0.5 * TB <= p.hbm_bandwidth_bytes_per_s <= 10 * TB
    assert 16e9 <= p.hbm_bytes <= 300e9
    assert 16 << 20 <= p.l2_bytes <= 256 << 20
    assert 64 <= p.sm_count <= 200
    assert 1000 <= p.clock_boost_mhz <= 3000
    assert p.max_shared_memory_per_block_bytes <= p.max_shared_memory_per_sm_bytes
    assert p.max_shared_memory_per_sm_bytes - p.max_shared_memory_per_block_bytes == 1024
    assert p.max_threads_per_sm in (1536, 2048)
    # Every profile here has tensor cores: half precision beats fp32 on CUDA cores.
    assert peaks.bf16 > peaks.fp32 and peaks.fp16 > peaks.fp32
    # NVIDIA rounds: B200's TF32 is published as 2.2 PFLOP/s sparse beside 4.5 for BF16.
    assert peaks.tf32 >= peaks.fp32 and peaks.bf16 == pytest.approx(2 * peaks.tf32, rel=0.03)
    assert peaks.fp8 == 0 or peaks.fp8 == pytest.approx(2 * peaks.bf16, rel=0.02)
    assert p.interconnect.bandwidth_bytes_per_s >= p.interconnect.pcie_bandwidth_bytes_per_s


def test_datasheet_figures():
    h100 = hw.load_profile("H100", HW_DIR)
    assert (h100.sm_count, h100.l2_bytes, h100.hbm_bytes) == (132, 50 << 20, 80 * 10**9)
    assert h100.hbm_bandwidth_bytes_per_s == 3.35e12
    assert (h100.peak_flops.bf16, h100.peak_flops.fp8) == (989.4e12, 1978.9e12)
    assert (h100.peak_flops.tf32, h100.peak_flops.fp32) == (494.7e12, 66.9e12)
    assert h100.interconnect.kind == "NVLink4" and h100.interconnect.bandwidth_bytes_per_s == 900e9
    assert h100.measured.copy_bandwidth_bytes_per_s == 3.00e12
    assert hw.load_profile("H200", HW_DIR).hbm_bandwidth_bytes_per_s == 4.8e12
    assert hw.load_profile("GB200", HW_DIR).interconnect.bandwidth_bytes_per_s == 1.8e12


# --- names ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("spelling, name", [
    ("h100", "H100"), ("H100", "H100"), ("h100-sxm5", "H100"), ("NVIDIA H100 80GB HBM3", "H100"),
    ("gb200", "GB200"), ("GB200-NVL72", "GB200"), ("rtx4090", "RTX4090"),
    ("RTX-4090", "RTX4090"), ("rtx 4090", "RTX4090"), ("4090", "RTX4090"),
    ("NVIDIA GeForce RTX 4090", "RTX4090"), ("l40s", "L40S"), ("a100_sxm4_80gb", "A100"),
])
def test_names_and_aliases_are_case_insensitive(spelling, name):
    assert hw.load_profile(spelling, HW_DIR).name == name


def test_unknown_name_lists_known_targets_and_suggests():
    with pytest.raises(hw.UnknownTargetError) as err:
        hw.load_profile("H900", HW_DIR)
    text = str(err.value)
    assert text.startswith("unknown target GPU 'H900'; known targets: "
                           "A100, B200, GB200, H100, H200, L40S, RTX4090")
    assert "did you mean 'H" in text
    assert isinstance(err.value, ValueError)
    with pytest.raises(hw.UnknownTargetError) as err:
        hw.load_profile("TPUv5", HW_DIR)
    assert "did you mean" not in str(err.value)


# --- to_dict and dtypes --------------------------------------------------------------------------


def test_to_dict_is_canonical_and_complete():
    h100 = hw.load_profile("H100", HW_DIR)
    d = h100.to_dict()
    assert "sources" not in d and "aliases" not in d
    assert d["compute_capability"] == [9, 0] and d["peak_flops"]["bf16"] == 989.4e12
    assert set(d["interconnect"]) == {"kind", "bandwidth_bytes_per_s", "pcie_gen",
                                      "pcie_bandwidth_bytes_per_s"}
    assert json.dumps(d, sort_keys=True) == json.dumps(h100.to_dict(), sort_keys=True)
    assert json.loads(json.dumps(d)) == d


def test_to_dict_is_the_same_in_another_process():
    here = json.dumps({p.name: p.to_dict() for p in all_profiles()}, sort_keys=True)
    code = ("import json; from xgbuild import hw; from pathlib import Path; d = Path(%r); "
            "print(json.dumps({n: hw.load_profile(n, d).to_dict() for n in hw.known_targets(d)}, "
            "sort_keys=True))" % str(HW_DIR))
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, check=True,
                         capture_output=True, text=True).stdout.strip()
    assert out == here


def test_profiles_are_frozen_hashable_and_compare_by_value():
    h100 = hw.load_profile("H100", HW_DIR)
    assert hw.load_profile("h100-sxm", HW_DIR) is h100  # cached
    with pytest.raises(AttributeError):
        h100.sm_count = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        h100.sources["sm_count"] = "x"  # type: ignore[index]
    assert hash(h100) == hash(hw.load_profile("H100", HW_DIR))
    assert h100 != hw.load_profile("H200", HW_DIR)


def test_peak_flops_for_maps_xg_dtypes():
    h100 = hw.load_profile("H100", HW_DIR)
    assert h100.peak_flops_for("float32") == 66.9e12
    assert h100.peak_flops_for("float32", tf32=True) == 494.7e12
    assert h100.peak_flops_for("bfloat16") == 989.4e12
    assert h100.peak_flops_for("float16") == 989.4e12
    assert h100.peak_flops_for("float8") == 1978.9e12
    with pytest.raises(ValueError, match="no peak FLOP/s for dtype 'int64'; known dtypes: .*bfloat16"):
        h100.peak_flops_for("int64")


# --- malformed files -----------------------------------------------------------------------------


def write_variant(tmp_path: Path, edit) -> Path:
    """A copy of hw/ whose h100.toml went through `edit(text) -> text`."""
    out = tmp_path / "hw"
    out.mkdir()
    for src in HW_DIR.glob("*.toml"):
        text = src.read_text()
        (out / src.name).write_text(edit(text) if src.name == "h100.toml" else text)
    return out


def drop_line(prefix: str):
    return lambda text: "\n".join(l for l in text.splitlines() if not l.startswith(prefix))


def replace(old: str, new: str):
    def edit(text: str) -> str:
        assert old in text
        return text.replace(old, new, 1)
    return edit


@pytest.mark.parametrize("edit, field, problem", [
    (drop_line("sm_count ="), "sm_count", "is missing"),
    (drop_line("fp8 ="), "peak_flops.fp8", "is missing"),
    (drop_line("kind ="), "interconnect.kind", "is missing"),
    (replace("sm_count = 132", 'sm_count = "132"'), "sm_count", "must be an integer"),
    (replace("sm_count = 132", "sm_count = true"), "sm_count", "must be an integer"),
    (replace("sm_count = 132", "sm_count = 132.0"), "sm_count", "must be an integer"),
    (replace("sm_count = 132", "sm_count = -132"), "sm_count", "must be at least 1"),
    (replace("l2_bytes = 52428800", "l2_bytes = 0"), "l2_bytes", "must be at least 1"),
    (replace("bf16 = 989.4e12", "bf16 = -1.0"), "peak_flops.bf16", "must be finite"),
    (replace("bf16 = 989.4e12", "bf16 = nan"), "peak_flops.bf16", "must be finite"),
    (replace("fp32 = 66.9e12", "fp32 = 0.0"), "peak_flops.fp32", "greater than 0"),
    (replace("hbm_bandwidth_bytes_per_s = 3.35e12", "hbm_bandwidth_bytes_per_s = inf"),
     "hbm_bandwidth_bytes_per_s", "must be finite"),
    (replace('arch = "sm_90"', 'arch = "sm_80"'), "arch", "means 'sm_90'"),
    (replace("compute_capability = [9, 0]", "compute_capability = [9]"),
     "compute_capability", "[major, minor]"),
    (replace("warp_size = 32", "warp_size = 33"), "warp_size", "power of two"),
    (replace("max_shared_memory_per_block_bytes = 232448",
             "max_shared_memory_per_block_bytes = 300000"),
     "max_shared_memory_per_block_bytes", "exceeds"),
    (replace("clock_boost_mhz = 1980", "clock_boost_mhz = 1980\nclock_base_mhz = 1000"),
     "clock_base_mhz", "not a known field"),
    (replace("[peak_flops]", "[peak_flops]\nint8 = 1e15"), "peak_flops.int8", "not a known field"),
    (replace('aliases = ["h100-sxm"', 'aliases = [7, "h100-sxm"'), "aliases", "non-empty strings"),
    (drop_line('"peak_flops.bf16" ='), "sources.peak_flops.bf16", "is missing"),
    (drop_line("sm_count = \"NVIDIA"), "sources.sm_count", "is missing"),
    (drop_line('"measured.bf16_matmul_flops_per_s" ='),
     "sources.measured.bf16_matmul_flops_per_s", "is missing"),
    (replace("\n[sources]\n", '\n[sources]\n"peak_flops.int8" = "a made-up source"\n'),
     "sources.peak_flops.int8", "not a known field"),
    (replace('memory_kind = "HBM3"', 'memory_kind = ""'), "memory_kind", "must not be empty"),
])
def test_malformed_profile_names_file_and_field(tmp_path, edit, field, problem):
    hw_dir = write_variant(tmp_path, edit)
    with pytest.raises(hw.HardwareProfileError) as err:
        hw.load_profile("H100", hw_dir)
    text = str(err.value)
    assert str(hw_dir.resolve() / "h100.toml") in text
    assert f"`{field}`" in text and problem in text


def test_invalid_toml_names_the_file(tmp_path):
    hw_dir = write_variant(tmp_path, lambda text: text + "\nthis is = not [toml\n")
    with pytest.raises(hw.HardwareProfileError, match=r"h100\.toml: invalid TOML"):
        hw.known_targets(hw_dir)


def test_duplicate_alias_is_rejected(tmp_path):
    hw_dir = write_variant(tmp_path, replace('"h100-sxm",', '"h100-sxm", "H-200",'))
    # Files load in name order, so h200.toml finds its own name taken by h100.toml's alias.
    with pytest.raises(hw.HardwareProfileError,
                       match=r"h200\.toml: name or alias 'H200' is already used by .*h100\.toml"):
        hw.load_profile("A100", hw_dir)


def test_missing_directory(tmp_path):
    with pytest.raises(hw.HardwareProfileError, match="directory not found"):
        hw.known_targets(tmp_path / "nowhere")


def test_an_edited_file_is_reloaded(tmp_path):
    hw_dir = write_variant(tmp_path, lambda text: text)
    assert hw.load_profile("H100", hw_dir).sm_count == 132
    path = hw_dir / "h100.toml"
    path.write_text(path.read_text().replace("sm_count = 132", "sm_count = 114"))
    assert hw.load_profile("H100", hw_dir).sm_count == 114
