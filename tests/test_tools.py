"""tools/: the attention ablation's patches still apply to the kernel they patch (CPU only)."""

import importlib.util
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parent.parent / "tools" / "attention_ablation.py"


def load_tool():
    spec = importlib.util.spec_from_file_location("attention_ablation", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_ablation_changes_only_its_part_of_the_kernel():
    tool = load_tool()
    source = (tool.KERNELS / tool.WIDE).read_text()
    assert tool.patch(source) == source
    no_loads = tool.patch(source, no_loads=True)
    assert tool.LOOP_LOADS not in no_loads and "vw_load_key_tile<128>" not in no_loads
    assert tool.QK_LATENT in no_loads and tool.PV_STEPS in no_loads
    half = tool.patch(source, half_loads=True)
    assert half.count("min(kv_len, key0 + 32), wtid") == 2
    light = tool.patch(source, light_mma=True)
    assert "step < 4; ++step)\n        wgmma_m64n72k16_ss<0>(s, wgmma_desc(nope_addr" in light
    assert "for (int kk = 0; kk < 1; ++kk)" in light and tool.LOOP_LOADS in light
    both = tool.patch(source, no_loads=True, light_mma=True)
    assert tool.LOOP_LOADS not in both and "kk < 1" in both


def test_a_changed_kernel_is_refused():
    tool = load_tool()
    source = (tool.KERNELS / tool.WIDE).read_text().replace("step < 32", "step < 30")
    with pytest.raises(ValueError, match="no longer applies"):
        tool.patch(source, light_mma=True)
