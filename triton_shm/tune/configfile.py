"""The tuned config.pbtxt: the user's file with the tuned fields that changed replaced."""
from __future__ import annotations

from typing import Any

from google.protobuf import text_format

from ..core.models.config import config_from_json, mc, parse_pbtxt
from ..errors import TritonShmError
from . import TuneError
from .pbtxt import Span, replace_fields, top_level_fields
from .space import PROCESS_PER_INSTANCE, Knobs


def changes(base: Knobs, chosen: Knobs) -> list[str]:
    """The config fields that differ, with what they were and what they are, one line each."""
    out = []
    if (base.instances, base.kind) != (chosen.instances, chosen.kind):
        out.append(f"instance_group: {base.instances} x {base.kind} -> {chosen.instances} x {chosen.kind}")
    if base.max_batch_size != chosen.max_batch_size:
        out.append(f"max_batch_size: {base.max_batch_size} -> {chosen.max_batch_size}")

    def dyn(k: Knobs) -> str:
        if not k.dynamic_batching:
            return "off"
        return f"max_queue_delay_microseconds {k.queue_delay_us}" + (
            f", preferred_batch_size [ {k.max_batch_size} ]" if k.preferred_max else "")
    if dyn(base) != dyn(chosen) or (chosen.dynamic_batching and base.max_batch_size != chosen.max_batch_size
                                    and chosen.preferred_max):
        out.append(f"dynamic_batching: {dyn(base)} -> {dyn(chosen)}")
    if base.process_per_instance != chosen.process_per_instance:
        word = {True: "yes", False: "no", None: "unset"}
        out.append(f"parameters {PROCESS_PER_INSTANCE}: {word[base.process_per_instance]} -> "
                   f"{word[chosen.process_per_instance]}")
    return out


def _field_text(config: mc.ModelConfig, name: str) -> str:
    only = mc.ModelConfig()
    if name == "parameters":
        if PROCESS_PER_INSTANCE in config.parameters:
            only.parameters[PROCESS_PER_INSTANCE].CopyFrom(config.parameters[PROCESS_PER_INSTANCE])
    elif name == "max_batch_size":
        only.max_batch_size = config.max_batch_size
    elif name == "dynamic_batching":
        if config.HasField("dynamic_batching"):
            only.dynamic_batching.CopyFrom(config.dynamic_batching)
    else:
        only.instance_group.extend(config.instance_group)
    return text_format.MessageToString(only)


def _is_ppi_entry(span: Span) -> bool:
    probe = mc.ModelConfig()
    try:
        text_format.Parse(span.text, probe)
    except text_format.ParseError:
        return False
    return PROCESS_PER_INSTANCE in probe.parameters


def tuned_text(user_text: str, chosen_config: dict[str, Any], base: Knobs, chosen: Knobs,
               comment: list[str]) -> str:
    """``user_text`` with the fields that changed from ``base`` to ``chosen`` set as in
    ``chosen_config`` (the override tune loaded), under ``comment`` lines."""
    try:
        config = config_from_json(chosen_config)
    except TritonShmError as e:
        raise TuneError(f"cannot write the chosen config: {e}") from None
    lines = "".join(f"# {line}\n" if line else "#\n" for line in comment)
    if not user_text.strip():  # no config.pbtxt: the whole config as served, with the changes
        return lines + text_format.MessageToString(config)
    fields = []
    if (base.instances, base.kind) != (chosen.instances, chosen.kind):
        fields.append("instance_group")
    if base.max_batch_size != chosen.max_batch_size:
        fields.append("max_batch_size")
    if (base.dynamic_batching, base.queue_delay_us, base.preferred_max, base.max_batch_size) != \
            (chosen.dynamic_batching, chosen.queue_delay_us, chosen.preferred_max, chosen.max_batch_size):
        fields.append("dynamic_batching")
    if base.process_per_instance != chosen.process_per_instance:
        fields.append("parameters")
    try:
        spans = top_level_fields(user_text)
    except ValueError as e:
        raise TuneError(f"cannot rewrite the model's config.pbtxt: {e}") from None
    remove = [s for s in spans if s.name in fields and (s.name != "parameters" or _is_ppi_entry(s))]
    new = lines + "".join(_field_text(config, f) for f in fields)
    text = replace_fields(user_text, remove, new)
    try:
        parsed = parse_pbtxt(text, "the tuned config.pbtxt")
    except TritonShmError as e:
        raise TuneError(f"the rewritten config does not parse ({e}); please report this") from None
    for f in fields:  # what the file now says is what was measured
        if _field_text(parsed, f) != _field_text(config, f):
            raise TuneError(f"the rewritten config's {f} differs from the measured one; please report this")
    return text
