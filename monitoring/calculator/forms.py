"""The calculator's inputs from a query string: presets first, then every field the query names, then validation.

A query may name presets (``model``, ``hw``, ``host``, ``link``; ``rig`` for a rig's own figures) and any field;
a field it gives wins over the preset's. Bad input is a form error per field and nothing is computed.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.http import QueryDict

from inference.backends.base import LayerKV, ModelArchitecture
from monitoring.calculator import model as calc
from monitoring.calculator import presets
from monitoring.calculator.selectors import RigFacts

GIB = 2**30
RIG, CUSTOM = "rig", "custom"
DEFAULTS: dict[str, Any] = {
    "model": "llama-3.1-8b",
    "quant": "q4_k_m",
    "kv_type": "f16",
    "context": 8192,
    "sessions": 1,
    "prompt": 1000,
    "hw": "rtx-4090",
    "link": "pcie4-x16",
    "spill": "cpu",
    "price": 0.30,
}
PRESET_GROUPS: dict[str, dict[str, Any]] = {
    "model": presets.MODELS,
    "hw": presets.DEVICES,
    "host": presets.HOSTS,
    "link": presets.LINKS,
}


def _choices(group: dict[str, Any], *, rig: str = "") -> list[tuple[str, str]]:
    extra = [(RIG, rig)] if rig else []
    return [(key, p.label) for key, p in group.items()] + extra + [(CUSTOM, "custom")]


def _int(low: int, high: int, **kw: Any) -> forms.IntegerField:
    return forms.IntegerField(min_value=low, max_value=high, **kw)


def _float(low: float, high: float, **kw: Any) -> forms.FloatField:
    return forms.FloatField(min_value=low, max_value=high, **kw)


class CalculatorForm(forms.Form):
    rig = forms.IntegerField(required=False, min_value=1, help_text="a rig whose finished turns are plotted")
    model = forms.ChoiceField(choices=_choices(presets.MODELS, rig="the rig's model"))
    layers = _int(1, 1000, label="layers")
    heads = _int(1, 1024, label="attention heads")
    kv_heads = _int(1, 1024, label="KV heads")
    embd = _int(1, 131_072, label="embedding length")
    head_dim = _int(1, 4096, required=False, label="head dim (blank: embedding / heads)")
    sliding_layers = _int(0, 1000, required=False, label="of the layers, sliding-window (blank: none)")
    window = _int(1, 10_000_000, required=False, label="sliding window (tokens)")
    recurrent_layers = _int(0, 1000, required=False, label="of the layers, recurrent: no KV (blank: none)")
    state_mib = _float(0, 100_000, required=False, label="recurrent state per layer and session (MiB)")
    params_b = _float(1e-4, 100_000, label="parameters (billions)")
    quant = forms.ChoiceField(choices=[(q, q) for q in calc.WEIGHT_BITS_PER_WEIGHT], label="weight quantisation")
    weight_gib = _float(1e-4, 1_000_000, required=False, label="weight file size (GiB; blank: from the quantisation)")
    kv_type = forms.ChoiceField(choices=[(t, t) for t in calc.KV_CACHE_TYPES], label="KV cache type")
    context = _int(1, 10_000_000, label="context per session (tokens)")
    sessions = _int(1, 4096, label="concurrent sessions")
    prompt = _int(0, 10_000_000, label="prompt (tokens)")
    hw = forms.ChoiceField(choices=_choices(presets.DEVICES, rig="the rig (as measured)"), label="accelerator or CPU")
    vram_gib = _float(0.01, 65_536, label="fast memory (VRAM) GiB")
    vram_gbs = _float(0.1, 20_000, label="fast memory bandwidth GB/s")
    reserved_gib = _float(0, 1024, label="fast memory not for the model (GiB)")
    host = forms.ChoiceField(choices=_choices(presets.HOSTS, rig="the rig's RAM"), label="system RAM")
    ram_gib = _float(0, 65_536, label="system RAM GiB (0: nothing to spill to)")
    ram_gbs = _float(0, 20_000, label="system RAM bandwidth GB/s")
    link = forms.ChoiceField(choices=_choices(presets.LINKS), label="link")
    link_gbs = _float(0.1, 2000, label="link bandwidth GB/s")
    spill = forms.ChoiceField(
        choices=[("cpu", "computed where it lies (llama.cpp)"), ("link", "read over the link")],
        label="spilled layers are",
    )
    tflops = _float(0.001, 100_000, required=False, label="compute TFLOP/s (prefill; blank: not computed)")
    watts = _float(1, 100_000, required=False, label="power while decoding (W; blank: no energy)")
    price = _float(0, 100, required=False, label="electricity price per kWh")

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        heads, kv_heads, embd = data.get("heads"), data.get("kv_heads"), data.get("embd")
        if heads and kv_heads and (kv_heads > heads or heads % kv_heads):
            self.add_error("kv_heads", "KV heads must divide the attention heads")
        layers, sliding, recurrent = data.get("layers"), data.get("sliding_layers") or 0, data.get("recurrent_layers")
        if layers and sliding + (recurrent or 0) > layers:
            self.add_error("sliding_layers", "sliding-window and recurrent layers are more than the layers")
        if sliding and not data.get("window"):
            self.add_error("window", "sliding-window layers need their window")
        if heads and embd and not data.get("head_dim") and embd % heads:
            self.add_error("head_dim", "the embedding length does not divide into the heads: give the head dim")
        if data.get("prompt") is not None and data.get("context") and data["prompt"] > data["context"]:
            self.add_error("prompt", "the prompt must fit in the context")
        if data.get("vram_gib") and data.get("reserved_gib") is not None and data["reserved_gib"] >= data["vram_gib"]:
            self.add_error("reserved_gib", "the reserved memory takes the whole fast memory")
        if data.get("ram_gib") and not data.get("ram_gbs"):
            self.add_error("ram_gbs", "system RAM that holds something must have a bandwidth")
        return data


def bind(query: QueryDict | dict[str, Any], rig: RigFacts | None) -> CalculatorForm:
    """The form for ``query``: defaults, then the presets it names (a device's own RAM preset unless ``host`` is
    named), then its own non-blank fields. Unknown preset keys are left for the form to refuse."""
    given = {key: str(query.get(key, "")).strip() for key in query}
    given = {key: value for key, value in given.items() if value}
    data: dict[str, Any] = dict(DEFAULTS)
    data.update({key: given[key] for key in PRESET_GROUPS if key in given})
    device = presets.DEVICES.get(str(data["hw"]))
    if "host" not in given:
        data["host"] = RIG if data["hw"] == RIG else device.host if device else CUSTOM
    for group, table in PRESET_GROUPS.items():
        key = str(data[group])
        if key in table:
            data.update(table[key].fields())
        elif key == RIG and rig is not None and group != "link":
            data.update({"model": rig.model, "hw": rig.hw, "host": rig.host}[group])
    data.update(given)
    form = CalculatorForm(data)
    form.is_valid()
    if RIG in (data["model"], data["hw"], data["host"]):
        _check_rig(form, data, rig)
    return form


def _check_rig(form: CalculatorForm, data: dict[str, Any], rig: RigFacts | None) -> None:
    if rig is None:
        named = [group for group in ("model", "hw", "host") if data[group] == RIG]
        form.add_error("rig", f"{', '.join(named)}=rig needs rig=<id> of an enabled rig")
        return
    if data["model"] == RIG and rig.model_error:
        form.add_error("model", f"{rig.name}: {rig.model_error}")
    if data["model"] == RIG and not rig.model_error and "params_b" not in rig.model and not data.get("params_b"):
        form.add_error("params_b", f"{rig.name} does not report its parameter count: type it")
    if data["hw"] == RIG and not rig.hw.get("vram_gbs") and not data.get("vram_gbs"):
        form.add_error(
            "vram_gbs",
            f"{rig.name}: its fast memory's bandwidth is not known; type it (a CPU rig's: "
            "manage.py rigdash_bandwidth measures it)",
        )


def inputs(form: CalculatorForm) -> tuple[calc.ModelSpec, calc.Hardware, calc.Workload, float | None]:
    """The calculator's inputs from a valid form."""
    d = form.cleaned_data
    head_dim = d["head_dim"] or d["embd"] // d["heads"]
    sliding, recurrent = d.get("sliding_layers") or 0, d.get("recurrent_layers") or 0
    state = round((d.get("state_mib") or 0) * 2**20)
    layers = (
        (LayerKV(d["kv_heads"], head_dim, head_dim),) * (d["layers"] - sliding - recurrent)
        + (LayerKV(d["kv_heads"], head_dim, head_dim, window=d.get("window") or 0),) * sliding
        + (LayerKV(0, head_dim, head_dim, state_bytes=state),) * recurrent
    )
    arch = ModelArchitecture(
        arch="custom",
        block_count=d["layers"],
        head_count=d["heads"],
        head_count_kv=d["kv_heads"],
        embedding_length=d["embd"],
        key_length=head_dim,
        value_length=head_dim,
        layers=layers,
    )
    params = d["params_b"] * 1e9
    weights = d["weight_gib"] * GIB if d["weight_gib"] else calc.weight_bytes(params=params, quant=d["quant"])
    slow = calc.Tier(d["ram_gib"] * GIB, d["ram_gbs"] * 1e9) if d["ram_gib"] else None
    hw = calc.Hardware(
        fast=calc.Tier(d["vram_gib"] * GIB, d["vram_gbs"] * 1e9),
        slow=slow,
        link_bytes_s=d["link_gbs"] * 1e9,
        spill_read=d["spill"],
        reserved_bytes=d["reserved_gib"] * GIB,
        flops=d["tflops"] * 1e12 if d["tflops"] else None,
        power_w=d["watts"],
    )
    work = calc.Workload(
        context_tokens=d["context"], sessions=d["sessions"], prompt_tokens=d["prompt"], kv_type=d["kv_type"]
    )
    return calc.ModelSpec(arch, params, weights), hw, work, d["price"]


def query_of(form: CalculatorForm) -> dict[str, Any]:
    """Every input as the query string that restores it."""
    return {name: ("" if value is None else value) for name, value in form.cleaned_data.items()}
