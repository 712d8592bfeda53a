"""Ensembles: a DAG of models run as one model, scheduled in the front-end.

Each step runs as soon as the tensors it maps in exist, so independent branches run in
parallel. A step is an ordinary request to its model's own scheduler (dynamic batching
applies); a step's outputs stay in the worker's shared-memory output arena and are handed
to the next step as views, so they are copied once into the next worker's input arena
and never cross a socket. Errors name the step that failed. An ensemble input or output
with a ``reshape`` is, as in Triton, ``dims`` to the client and ``reshape.shape`` to the
steps (after the batch dimension when the ensemble batches).
"""
from __future__ import annotations

import asyncio
import functools
import time
from typing import TYPE_CHECKING, Any, Union

from ...errors import Internal, InvalidArgument, TritonShmError, Unavailable, Unsupported
from ..data.datatypes import config_to_wire
from ..data.types import InferRequest, InferResponse, InputTensor, OutputTensor, RequestedOutput
from ..models.config import data_type_name
from ..models.validation import validate_request
from ..observability.statistics import ModelStats
from .interface import Instance

if TYPE_CHECKING:
    from ..data.shm_registry import Region
    from ..models.repository import ModelRepository
    from ..models.validation import RequestPlan
    from ..models.version import ModelVersion

Tensor = Union[InputTensor, OutputTensor]


def composing_models(config) -> list[str]:
    return [step.model_name for step in config.ensemble_scheduling.step]


def _wire_types(tensors) -> dict[str, str]:
    return {t.name: config_to_wire(data_type_name(t.data_type)) for t in tensors}


def _reshapes(tensors) -> dict[str, tuple[list[int], list[int]]]:
    """name -> (dims, reshape.shape) of the tensors that have a reshape."""
    return {t.name: (list(t.dims), list(t.reshape.shape)) for t in tensors if t.HasField("reshape")}


def reshaped(shape: list[int], batched: bool, source: list[int], target: list[int]) -> list[int] | None:
    """``shape`` (of the form ``source``, after a batch dimension when ``batched``) in the form
    ``target``: each variable (-1) dimension of ``target`` takes, in order, the size of one of
    ``source``'s; None when ``shape`` does not have the form ``source``."""
    lead, body = (shape[:1], shape[1:]) if batched and shape else ([], shape)
    if len(body) != len(source) or any(d != -1 and d != g for g, d in zip(body, source)):
        return None
    variable = iter([g for g, d in zip(body, source) if d == -1])
    return lead + [next(variable, 1) if d == -1 else d for d in target]


def validate_ensemble(config, repository: "ModelRepository") -> None:
    """The DAG is sound: composing models loaded and mapped by real tensor names, every
    tensor produced once and used, no cycle."""
    name, steps = config.name, list(config.ensemble_scheduling.step)
    if not steps:
        raise InvalidArgument(f"ensemble '{name}' has no steps")
    producer: dict[str, int] = {t.name: -1 for t in config.input}   # tensor -> producing step (-1: input)
    types = _wire_types(config.input)
    consumers: dict[str, list[int]] = {}
    for i, step in enumerate(steps):
        try:
            model = repository.get(step.model_name, str(step.model_version) if step.model_version > 0 else "",
                                   require_ready=True)
        except TritonShmError as e:
            raise InvalidArgument(f"ensemble '{name}' step {i}: composing model '{step.model_name}' is not "
                                  f"available: {e.message}") from None
        if model.decoupled:
            raise InvalidArgument(f"ensemble '{name}' step {i}: model '{step.model_name}' is decoupled; ensembles "
                                  "with decoupled steps are not supported yet")
        for model_input, tensor in step.input_map.items():
            spec = model.inputs.get(model_input)
            if spec is None:
                raise InvalidArgument(f"ensemble '{name}' step {i}: model '{step.model_name}' has no input "
                                      f"'{model_input}'")
            consumers.setdefault(tensor, []).append(i)
            types.setdefault(f"{i}:{model_input}", spec.datatype)
        missing = [n for n, s in model.inputs.items() if not s.optional and n not in step.input_map]
        if missing:
            raise InvalidArgument(f"ensemble '{name}' step {i}: input(s) {missing} of model "
                                  f"'{step.model_name}' are not mapped")
        for model_output, tensor in step.output_map.items():
            spec = model.outputs.get(model_output)
            if spec is None:
                raise InvalidArgument(f"ensemble '{name}' step {i}: model '{step.model_name}' has no output "
                                      f"'{model_output}'")
            if tensor in producer:
                raise InvalidArgument(f"ensemble '{name}': tensor '{tensor}' is produced more than once")
            producer[tensor] = i
            if types.setdefault(tensor, spec.datatype) != spec.datatype:
                raise InvalidArgument(f"ensemble '{name}': tensor '{tensor}' is {types[tensor]} but step {i} "
                                      f"makes it {spec.datatype}")
    for i, step in enumerate(steps):
        for tensor in step.input_map.values():
            if tensor not in producer:
                raise InvalidArgument(f"ensemble '{name}' step {i}: tensor '{tensor}' is not produced by any step "
                                      "nor an ensemble input (unconnected)")
    outputs = {t.name for t in config.output}
    for tensor in outputs:
        if tensor not in producer or producer[tensor] == -1:
            raise InvalidArgument(f"ensemble '{name}': output '{tensor}' is not produced by any step")
    for tensor, step in producer.items():
        if tensor not in consumers and tensor not in outputs:
            what = "input" if step == -1 else f"tensor of step {step}"
            raise InvalidArgument(f"ensemble '{name}': {what} '{tensor}' is not connected to anything")
    _check_acyclic(name, steps, producer)


def _check_acyclic(name: str, steps, producer: dict[str, int]) -> None:
    deps = {i: {producer[t] for t in s.input_map.values() if producer[t] >= 0} for i, s in enumerate(steps)}
    done: set[int] = set()
    while len(done) < len(steps):
        ready = [i for i in deps if i not in done and deps[i] <= done]
        if not ready:
            cycle = sorted(i for i in deps if i not in done)
            raise InvalidArgument(f"ensemble '{name}' has a cycle among steps {cycle}")
        done.update(ready)


class EnsembleScheduler:
    """Runs an ensemble's steps for each request (an ``interface.Scheduler``)."""

    def __init__(self, model: "ModelVersion", repository: "ModelRepository", stats: ModelStats):
        self.model, self.repository, self.stats = model, repository, stats
        self.steps = list(model.config.ensemble_scheduling.step)
        self._batched = model.config.max_batch_size > 0
        self._input_reshapes = _reshapes(model.config.input)
        self._output_reshapes = _reshapes(model.config.output)
        self._inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._closing = False

    async def submit(self, request: InferRequest, plan: "RequestPlan", regions: dict[str, "Region"],
                     trace: Any = None, stream: object = None) -> InferResponse:
        """``interface.Scheduler.submit``; the steps of a traced request are traced as its
        children, and an ensemble is never decoupled (``stream`` is unused)."""
        if self._closing:
            raise Unavailable(f"ensemble '{self.model.name}' is unloading")
        if plan.shm_inputs or plan.shm_outputs:
            raise Unsupported(f"ensemble '{self.model.name}': client shared-memory tensors are not supported "
                              "for ensembles yet")
        start = time.monotonic_ns()
        if trace is not None:
            trace.stamp("QUEUE_START", start)
        self._inflight += 1
        self._idle.clear()
        self.stats.pending += 1
        try:
            response = await self._run(request, plan, trace)
        except TritonShmError as e:
            self.stats.record_failure(time.monotonic_ns() - start, "BACKEND")
            raise e
        finally:
            self.stats.pending -= 1
            self._inflight -= 1
            if self._inflight == 0:
                self._idle.set()
        total = time.monotonic_ns() - start
        self.stats.execution_count += 1
        self.stats.record_success(plan.batch_size or 1, total, 0, 0, total, 0)
        return response

    async def _run(self, request: InferRequest, plan: "RequestPlan", trace: Any) -> InferResponse:
        tensors: dict[str, Tensor] = {t.name: t for t in request.inputs}
        for name, (dims, shape) in self._input_reshapes.items():
            t = tensors.get(name)
            if t is not None:  # its dims were checked: the steps see it as reshape.shape
                steps_shape = reshaped(list(t.shape), self._batched, dims, shape)
                tensors[name] = InputTensor(name, t.datatype, steps_shape if steps_shape is not None else
                                            list(t.shape), t.data)
        responses: list[InferResponse] = []
        todo = set(range(len(self.steps)))
        running: dict[asyncio.Task, int] = {}
        error: TritonShmError | None = None
        try:
            while todo or running:
                if error is None:
                    for i in sorted(todo):
                        if all(t in tensors for t in self.steps[i].input_map.values()):
                            todo.discard(i)
                            running[asyncio.ensure_future(self._run_step(i, tensors, request, trace))] = i
                if not running:
                    break
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    i = running.pop(task)
                    try:
                        response = task.result()
                    except TritonShmError as e:
                        error = error or type(e)(f"in ensemble '{self.model.name}', step {i} (model "
                                                 f"'{self.steps[i].model_name}'): {e.message}")
                        continue
                    responses.append(response)
                    for out in response.outputs:
                        target = self.steps[i].output_map.get(out.name)
                        if target is not None:
                            tensors[target] = out
            if error is not None:
                raise error
            outputs = []
            for name in plan.outputs:
                t = tensors[name]
                if t.data is None:  # an ensemble input passed straight through, from a client region
                    raise Unsupported(f"ensemble '{self.model.name}': output '{name}' is an input in shared memory")
                shape = list(t.shape)
                if name in self._output_reshapes:  # the steps make reshape.shape, the client gets dims
                    dims, steps_shape = self._output_reshapes[name]
                    client_shape = reshaped(shape, self._batched, steps_shape, dims)
                    if client_shape is None:
                        raise InvalidArgument(f"ensemble '{self.model.name}': output '{name}' has shape {shape}, "
                                              f"which does not match its reshape {steps_shape}")
                    shape = client_shape
                outputs.append(OutputTensor(name, t.datatype, shape, t.data))
        except BaseException:
            for r in responses:
                r.release()
            raise
        return InferResponse(model_name=self.model.name, model_version=str(self.model.version), id=request.id,
                             outputs=outputs, _release=functools.partial(_release_all, responses))

    async def _run_step(self, i: int, tensors: dict[str, Tensor], request: InferRequest,
                        trace: Any) -> InferResponse:
        step = self.steps[i]
        model = self.repository.get(step.model_name, str(step.model_version) if step.model_version > 0 else "",
                                    require_ready=True)
        inputs = [InputTensor(model_input, tensors[t].datatype, list(tensors[t].shape), tensors[t].data)
                  for model_input, t in step.input_map.items()]
        sub = InferRequest(model_name=model.name, model_version=str(model.version), id=request.id,
                           parameters=dict(request.parameters), inputs=inputs,
                           outputs=[RequestedOutput(n) for n in step.output_map])
        if trace is None:
            response = await model.queue().submit(sub, validate_request(model, sub), {})
        else:
            response = await self._run_traced_step(model, sub, trace)
        if response is None:  # a decoupled step: refused when the ensemble loads
            raise Internal(f"ensemble step model '{model.name}' answered on a stream")
        return response

    async def _run_traced_step(self, model: "ModelVersion", sub: InferRequest, parent: Any) -> InferResponse | None:
        tracer = parent.tracer
        trace = tracer.child(parent, model.name, model.version, sub.id)
        try:
            return await model.queue().submit(sub, validate_request(model, sub), {}, trace)
        finally:
            tracer.finish(trace)

    def inflight_count(self) -> int:
        return self._inflight

    async def drain(self) -> None:
        self._closing = True
        await self._idle.wait()

    # An ensemble runs on no instance of its own: its steps' schedulers see theirs go and come back.
    def instance_down(self, instance: Instance, reason: str) -> None:
        pass

    def instance_up(self, instance: Instance) -> None:
        pass


def ensemble_dependents(repository: "ModelRepository", name: str) -> list[str]:
    """Ensembles that use ``name`` as a step."""
    out: list[str] = []
    for entry in repository.models.values():
        for mv in entry.versions.values():
            if mv.ready and mv.config.platform == "ensemble" and name in composing_models(mv.config):
                out.append(entry.name)
                break
    return out


def _release_all(responses: list[InferResponse]) -> None:
    for r in responses:
        r.release()
