"""Model configuration: config.pbtxt parsing, Triton's defaults, and Triton's JSON form.

The schema is our protos/model_config.proto (wire- and field-compatible with Triton's),
so tritonclient's model_config_pb2 reads what the gRPC ModelConfig call returns.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from google.protobuf import json_format, text_format
from google.protobuf.descriptor import FieldDescriptor

from ..._proto import model_config_pb2 as mc
from ...errors import InvalidArgument

ModelConfig = mc.ModelConfig

# Which file a backend loads when the config names none, and which platform string
# the metadata reports for it.
DEFAULT_MODEL_FILENAME = {"onnxruntime": "model.onnx", "python": "model.py", "tensorrt": "model.plan",
                          "pytorch": "model.pt"}
PLATFORM_TO_BACKEND = {"onnxruntime_onnx": "onnxruntime", "tensorrt_plan": "tensorrt", "pytorch_libtorch": "pytorch"}
BACKEND_PLATFORM = {"onnxruntime": "onnxruntime_onnx", "python": "python", "tensorrt": "tensorrt_plan",
                    "pytorch": "pytorch_libtorch"}
SUPPORTED_BACKENDS = frozenset(DEFAULT_MODEL_FILENAME)
ENSEMBLE = "ensemble"

_INT64_TYPES = {FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT64,
                FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64}


def validate_model_name(name: str) -> str:
    """Reject names that could escape the repository or address nothing ("a..b" is a name)."""
    if not name or not name.strip():
        raise InvalidArgument("model name must not be empty")
    if _escapes(name):
        raise InvalidArgument(f"invalid model name '{name}'")
    return name


_C_SPACE = " \t\n\v\f\r"  # what C's isspace() trims


def _escapes(name: str) -> bool:
    return "/" in name or "\\" in name or "\x00" in name or name.strip() in (".", "..") \
        or name.strip(_C_SPACE) in (".", "..")


def check_load_name(name: str) -> None:
    """A model load's name, refused in Triton's words: empty or only whitespace, or one
    that could leave the repository (Triton: "..", or a "/"; here "." and "\\" too)."""
    if not name.strip(_C_SPACE):
        raise InvalidArgument("Model name cannot be empty. Please enter a valid name to deploy.")
    if _escapes(name):
        raise InvalidArgument(f"invalid model name '{name}', model name must not contain path traversal characters")


def parse_pbtxt(text: str, source: str = "config.pbtxt") -> ModelConfig:
    config = ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as e:
        raise InvalidArgument(f"failed to parse {source}: {_parse_error_kind(e)}") from None
    return config


def _parse_error_kind(error: text_format.ParseError) -> str:
    """Where and what kind of error, never the text found there: the file may not be
    the config it claims to be (a link to something secret), and its words must not
    reach a client."""
    message = str(error)
    if "has no field named" in message:
        kind = "unknown field"
    elif "Expected" in message or "expected" in message:
        kind = "syntax error"
    else:
        kind = "invalid value"
    line, column = error.GetLine(), error.GetColumn()
    return f"{kind} at line {line}, column {column}" if line else kind


CONFIGS_DIR = "configs"  # alternative config files, chosen with --model-config-name


def config_path(model_dir: Path, config_name: str = "") -> Path:
    """``configs/<config_name>.pbtxt`` where ``--model-config-name`` names one that exists,
    else ``config.pbtxt`` (which may not exist either)."""
    if config_name:
        custom = model_dir / CONFIGS_DIR / f"{config_name}.pbtxt"
        if custom.is_file():
            return custom
    return model_dir / "config.pbtxt"


def read_config(model_dir: Path, config_name: str = "") -> ModelConfig:
    """The model's config file, or an empty config when there is none (auto-complete fills it)."""
    path = config_path(model_dir, config_name)
    if not path.is_file():
        return ModelConfig()
    source = path.relative_to(model_dir).as_posix()
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidArgument(f"failed to read {source} of model '{model_dir.name}': {e}") from None
    return parse_pbtxt(text, f"{source} of model '{model_dir.name}'")


def _int64_to_numbers(message_descriptor, data: dict[str, Any]) -> None:
    """json_format writes 64-bit integers as strings; Triton writes numbers."""
    for key, value in data.items():
        field = message_descriptor.fields_by_name.get(key)
        if field is None:
            continue
        if field.message_type is not None:
            if field.message_type.GetOptions().map_entry:
                vfield = field.message_type.fields_by_name["value"]
                if vfield.message_type is not None:
                    for v in value.values():
                        _int64_to_numbers(vfield.message_type, v)
                elif vfield.type in _INT64_TYPES:
                    for k in value:
                        value[k] = int(value[k])
            elif field.is_repeated:  # protobuf 7 removed FieldDescriptor.label; is_repeated is in 6.31+ too
                for v in value:
                    _int64_to_numbers(field.message_type, v)
            else:
                _int64_to_numbers(field.message_type, value)
        elif field.type in _INT64_TYPES:
            data[key] = [int(v) for v in value] if isinstance(value, list) else int(value)


def message_to_json(message) -> dict[str, Any]:
    data = json_format.MessageToDict(message, preserving_proto_field_name=True,
                                     always_print_fields_with_no_presence=True)
    _int64_to_numbers(message.DESCRIPTOR, data)
    return data


def config_to_json(config: ModelConfig) -> dict[str, Any]:
    """The config as Triton prints it: proto field names, defaults printed, int64 as numbers."""
    return message_to_json(config)


def config_from_json(data: dict[str, Any], source: str = "model config") -> ModelConfig:
    try:
        return json_format.ParseDict(data, ModelConfig())
    except json_format.ParseError as e:
        raise InvalidArgument(f"invalid {source}: {e}") from None


def backend_of(config: ModelConfig, model_dir: Path) -> str:
    """Resolve the backend from `backend`, `platform`, or the model file present
    (``"ensemble"`` for ensembles, which run in the front-end's scheduler)."""
    if config.platform == ENSEMBLE:
        return ENSEMBLE
    if config.backend:
        backend = config.backend
    elif config.platform:
        backend = PLATFORM_TO_BACKEND.get(config.platform, config.platform)
    else:
        backend = ""
        for candidate, filename in DEFAULT_MODEL_FILENAME.items():
            if any((v / filename).is_file() for v in model_dir.iterdir() if v.is_dir()):
                backend = candidate
                break
        if not backend:
            raise InvalidArgument(
                f"unable to determine the backend for model '{model_dir.name}': config.pbtxt names "
                f"no backend or platform and no {', '.join(DEFAULT_MODEL_FILENAME.values())} was found")
    if backend not in SUPPORTED_BACKENDS:
        raise InvalidArgument(
            f"model '{model_dir.name}' needs backend '{backend}', which this server does not provide "
            f"(available: {', '.join(sorted(SUPPORTED_BACKENDS))})")
    return backend


def fill_defaults(config: ModelConfig, name: str, backend: str, gpus: list[int]) -> None:
    """Apply the defaults Triton applies before a model loads (and reports afterwards)."""
    if config.name and config.name != name:
        raise InvalidArgument(f"model name in config.pbtxt ('{config.name}') does not match the "
                              f"directory name '{name}'")
    config.name = name
    if config.HasField("sequence_batching") and not config.sequence_batching.max_sequence_idle_microseconds:
        config.sequence_batching.max_sequence_idle_microseconds = 1_000_000  # Triton's default, shown as used
    if backend == ENSEMBLE:
        if not config.HasField("version_policy"):
            config.version_policy.latest.num_versions = 1
        return
    config.backend = backend
    if backend != "python" and not config.platform:
        config.platform = BACKEND_PLATFORM[backend]
    if not config.default_model_filename:
        config.default_model_filename = DEFAULT_MODEL_FILENAME[backend]
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1
    opt = config.optimization
    if not opt.HasField("input_pinned_memory"):
        opt.input_pinned_memory.enable = True
    if not opt.HasField("output_pinned_memory"):
        opt.output_pinned_memory.enable = True
    if not config.instance_group:
        config.instance_group.add()
    for i, group in enumerate(config.instance_group):
        if not group.name:
            group.name = f"{name}_{i}"  # as Triton names it, one group or several
        if group.count < 1:
            group.count = 1
        if group.kind == mc.ModelInstanceGroup.KIND_AUTO:
            group.kind = mc.ModelInstanceGroup.KIND_GPU if gpus else mc.ModelInstanceGroup.KIND_CPU
        if group.kind == mc.ModelInstanceGroup.KIND_GPU:
            if not gpus:  # Triton's words
                raise InvalidArgument(f"instance group {group.name} of model {name} has kind KIND_GPU but no "
                                      "GPUs are available")
            if not group.gpus:
                group.gpus.extend(gpus)
            bad = [g for g in group.gpus if g not in gpus]
            if bad:
                raise InvalidArgument(f"instance group {group.name} of model {name} specifies invalid or "
                                      f"unsupported gpu id {bad[0]}. GPUs served (--gpus) are: "
                                      f"{', '.join(map(str, gpus))}")


def check_io(config: ModelConfig) -> None:
    """What must hold once auto-complete is done. A model may have no inputs (a graph of
    constants) and, as in Triton, no outputs (a Python model whose config override names
    none: it loads, and a request naming a tensor is refused)."""
    name = config.name
    if config.max_batch_size < 0:
        raise InvalidArgument(f"model '{name}': max_batch_size must be >= 0")
    for kind, tensors in (("input", config.input), ("output", config.output)):
        seen: set[str] = set()
        for t in tensors:
            if not t.name:
                raise InvalidArgument(f"model '{name}': an {kind} has no name")
            if t.name in seen:
                raise InvalidArgument(f"model '{name}': {kind} '{t.name}' is declared twice")
            seen.add(t.name)
            if t.data_type == mc.TYPE_INVALID:
                raise InvalidArgument(f"model '{name}': {kind} '{t.name}' has no data_type")
            problem = _shape_problem(t, config.max_batch_size)
            if problem:
                raise InvalidArgument(f"model {kind} '{t.name}' {problem} for {name}")


_DIM_RULE = "must be integer >= 1, or -1 to indicate a variable-size dimension"


def _shape_problem(t, max_batch_size: int) -> str:
    """Why a tensor's dims / reshape cannot describe data (empty when they can)."""
    has_reshape = t.HasField("reshape")
    if not t.dims:
        return "must specify 'dims'"
    if has_reshape and not t.reshape.shape and max_batch_size == 0:
        # an empty reshape is a scalar, which needs a batch dimension to carry any data
        return "cannot have empty reshape for non-batching model as scalar tensors are not supported"
    if any(d < 1 and d != -1 for d in t.dims):
        return f"dimension {_DIM_RULE}"
    if not has_reshape:
        return ""
    if any(d < 1 and d != -1 for d in t.reshape.shape):
        return f"reshape dimensions {_DIM_RULE}"
    dims, shape = list(t.dims), list(t.reshape.shape)
    if not shape:  # a scalar per batch row: dims must hold one element
        return "" if _fixed_chunks(dims) == [1] else "has different size for dims and reshape"
    ours, theirs = _fixed_chunks(dims), _fixed_chunks(shape)
    if len(ours) != len(theirs) and len(ours) > 1 and len(theirs) > 1:
        return "has different number of variable-size dimensions for dims and reshape"
    return "" if ours == theirs else "has different size for dims and reshape"


def _fixed_chunks(dims: list[int]) -> list[int]:
    """Element counts of the runs between variable-size dims: [2, 4, -1, 6] -> [8, 6]."""
    chunks, count = [], 1
    for d in dims:
        if d == -1:
            chunks.append(count)
            count = 1
        else:
            count *= d
    chunks.append(count)
    return chunks


def data_type_name(value: int) -> str:
    return mc.DataType.Name(value)
