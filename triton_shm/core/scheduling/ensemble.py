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
import itertools
import time
from typing import TYPE_CHECKING, Any, Union

from ...errors import Internal, InvalidArgument, TritonShmError, Unavailable, Unsupported
from ..data.datatypes import config_to_wire
from ..data.types import InferRequest, InferResponse, InputTensor, OutputTensor, RequestedOutput, ResponseStream
from ..models.config import data_type_name
from ..models.validation import validate_request
from ..observability.statistics import ModelStats
from .inflight import step_limiters
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
    _check_decoupled_flow(config, repository)


def _check_decoupled_flow(config, repository: "ModelRepository") -> None:
    """As Triton: each response of a decoupled step starts a flow of its own through the
    steps after it, so a step may not take tensors of two flows (of two decoupled steps, or
    of one and the ensemble's inputs); an ensemble with a decoupled step is decoupled."""
    name, steps = config.name, list(config.ensemble_scheduling.step)
    flow: dict[str, int] = {t.name: 0 for t in config.input}  # tensor -> its flow (0: the request's)
    flows = itertools.count(1)
    done: set[int] = set()
    decoupled = False
    while len(done) < len(steps):  # the DAG is acyclic: each pass takes a step at least
        for i, step in enumerate(steps):
            if i in done or any(t not in flow for t in step.input_map.values()):
                continue
            done.add(i)
            labels = {flow[t] for t in step.input_map.values()}
            if len(labels) > 1:
                raise InvalidArgument(f"in ensemble {name}, step of model '{step.model_name}' receives inputs "
                                      "originated from different decoupled models")
            model = repository.get(step.model_name, str(step.model_version) if step.model_version > 0 else "",
                                   require_ready=True)
            decoupled |= model.decoupled
            out = next(flows) if model.decoupled else (labels.pop() if labels else 0)
            for tensor in step.output_map.values():
                flow[tensor] = out
    if decoupled:
        config.model_transaction_policy.decoupled = True


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
        self._limiters = step_limiters(model.config)  # max_inflight_requests; None: no limit
        self._inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._closing = False

    async def submit(self, request: InferRequest, plan: "RequestPlan", regions: dict[str, "Region"],
                     trace: Any = None, stream: ResponseStream | None = None) -> InferResponse | None:
        """``interface.Scheduler.submit``; the steps of a traced request are traced as its
        children. An ensemble with a decoupled step is decoupled: its responses go to
        ``stream`` (``_StreamingRun``)."""
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
            if stream is None:
                response: InferResponse | None = await self._run(request, plan, trace)
            else:
                response = None
                await _StreamingRun(self, request, plan, trace, stream).run()
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

    def initial_tensors(self, request: InferRequest) -> dict[str, Tensor]:
        """The request's inputs as the steps see them (a reshaped input as reshape.shape)."""
        tensors: dict[str, Tensor] = {t.name: t for t in request.inputs}
        for name, (dims, shape) in self._input_reshapes.items():
            t = tensors.get(name)
            if t is not None:  # its dims were checked: the steps see it as reshape.shape
                steps_shape = reshaped(list(t.shape), self._batched, dims, shape)
                tensors[name] = InputTensor(name, t.datatype, steps_shape if steps_shape is not None else
                                            list(t.shape), t.data)
        return tensors

    def outputs(self, tensors: dict[str, Tensor], plan: "RequestPlan") -> list[OutputTensor]:
        """The requested ensemble outputs out of ``tensors`` (a reshaped one as dims)."""
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
        return outputs

    def step_error(self, i: int, e: TritonShmError) -> TritonShmError:
        return type(e)(f"in ensemble '{self.model.name}', step {i} (model '{self.steps[i].model_name}'): "
                       f"{e.message}")

    async def _run(self, request: InferRequest, plan: "RequestPlan", trace: Any) -> InferResponse:
        tensors = self.initial_tensors(request)
        responses: list[InferResponse] = []
        todo = set(range(len(self.steps)))
        running: dict[asyncio.Task, int] = {}
        error: TritonShmError | None = None
        limiters = self._limiters
        try:
            while todo or running:
                if error is None:
                    for i in sorted(todo):
                        if all(t in tensors for t in self.steps[i].input_map.values()):
                            todo.discard(i)
                            if limiters is not None:  # back-pressure: a slot of the step first
                                await limiters[i].acquire()
                            running[asyncio.ensure_future(self._run_step(i, tensors, request, trace))] = i
                if not running:
                    break
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    i = running.pop(task)
                    try:
                        response = task.result()
                    except TritonShmError as e:
                        error = error or self.step_error(i, e)
                        continue
                    responses.append(response)
                    for out in response.outputs:
                        target = self.steps[i].output_map.get(out.name)
                        if target is not None:
                            tensors[target] = out
            if error is not None:
                raise error
            outputs = self.outputs(tensors, plan)
        except BaseException:
            for r in responses:
                r.release()
            raise
        return InferResponse(model_name=self.model.name, model_version=str(self.model.version), id=request.id,
                             outputs=outputs, _release=functools.partial(_release_all, responses))

    def step_request(self, i: int, tensors: dict[str, Tensor], request: InferRequest
                     ) -> tuple["ModelVersion", InferRequest]:
        step = self.steps[i]
        model = self.repository.get(step.model_name, str(step.model_version) if step.model_version > 0 else "",
                                    require_ready=True)
        inputs = [InputTensor(model_input, tensors[t].datatype, list(tensors[t].shape), tensors[t].data)
                  for model_input, t in step.input_map.items()]
        return model, InferRequest(model_name=model.name, model_version=str(model.version), id=request.id,
                                   parameters=dict(request.parameters), inputs=inputs,
                                   outputs=[RequestedOutput(n) for n in step.output_map])

    async def _run_step(self, i: int, tensors: dict[str, Tensor], request: InferRequest,
                        trace: Any) -> InferResponse:
        try:
            model, sub = self.step_request(i, tensors, request)
            if model.decoupled:  # its model was reloaded as decoupled since the ensemble loaded
                raise Unavailable(f"model '{model.name}' is decoupled now: reload the ensemble")
            if trace is None:
                response = await model.queue().submit(sub, validate_request(model, sub), {})
            else:
                response = await self._run_traced_step(model, sub, trace)
        finally:
            if self._limiters is not None:
                self._limiters[i].release()
        if response is None:
            raise Internal(f"ensemble step model '{model.name}' answered on a stream")
        return response

    async def _run_traced_step(self, model: "ModelVersion", sub: InferRequest, parent: Any,
                               stream: ResponseStream | None = None) -> InferResponse | None:
        tracer = parent.tracer
        trace = tracer.child(parent, model.name, model.version, sub.id)
        try:
            return await model.queue().submit(sub, validate_request(model, sub), {}, trace, stream)
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


class _Held:
    """A step's response, released once no flow and no ensemble response reads its tensors."""
    __slots__ = ("response", "readers")

    def __init__(self, response: InferResponse):
        self.response, self.readers = response, 0

    def take(self) -> "_Held":
        self.readers += 1
        return self

    def drop(self) -> None:
        self.readers -= 1
        if self.readers == 0:
            self.response.release()


class _Flow:
    """The tensors of one flow through a decoupled ensemble: the request's (the root), or
    those of one response of a decoupled step, with the tensors of the flow it came from,
    and what the steps after it make of them. A step runs in the flow where one of its
    inputs is new (made there), so each response of a decoupled step runs the steps after
    it once, and a step that does not follow it runs once, in the flow of its inputs."""
    __slots__ = ("tensors", "new", "started", "held", "running", "answered", "root")

    def __init__(self, tensors: dict[str, Tensor], held: list[_Held], started: set[int] | None = None):
        self.tensors, self.new, self.held = tensors, set(tensors), held
        self.started: set[int] = set() if started is None else started  # steps run in it or before it
        self.root = started is None
        self.running = 0        # its steps dispatched and not finished
        self.answered = False   # its ensemble response is sent

    def add(self, held: _Held, tensors: dict[str, Tensor]) -> None:
        self.held.append(held.take())
        self.tensors.update(tensors)
        self.new.update(tensors)

    def fork(self, held: _Held, tensors: dict[str, Tensor]) -> "_Flow":
        child = _Flow({**self.tensors, **tensors}, [h.take() for h in self.held] + [held.take()], set(self.started))
        child.new = set(tensors)
        return child

    def close(self) -> None:
        held, self.held = self.held, []
        for h in held:
            h.drop()


# (flow, step, a response | an error | None, final, the step is decoupled)
_Event = tuple[_Flow, int, Union[InferResponse, TritonShmError, None], bool, bool]


class _StreamingRun:
    """One request of a decoupled ensemble: every response of a decoupled step starts a
    flow (``_Flow``) through the steps after it, each flow that makes the ensemble's
    outputs is one response on ``stream``, and the final flag follows the last step (as
    Triton). The steps report to one queue, which this coroutine alone reads; a client that
    goes away cancels it, which cancels the steps."""

    def __init__(self, scheduler: EnsembleScheduler, request: InferRequest, plan: "RequestPlan", trace: Any,
                 stream: ResponseStream):
        self.scheduler, self.request, self.plan, self.trace, self.stream = scheduler, request, plan, trace, stream
        self.events: asyncio.Queue[_Event] = asyncio.Queue()
        self.tasks: set[asyncio.Task] = set()
        self.step_streams: set[ResponseStream] = set()
        self.flows: set[_Flow] = set()  # not closed yet
        self.running = 0  # steps dispatched whose final event is not read yet
        self.error: TritonShmError | None = None

    async def run(self) -> None:
        steps = self.scheduler.steps
        root = _Flow(self.scheduler.initial_tensors(self.request), [])
        self.flows.add(root)
        todo = [root]
        try:
            while True:
                while todo:
                    flow = todo.pop()
                    if flow not in self.flows:
                        continue
                    if self.error is None:
                        await self._dispatch(flow)
                        self._answer(flow)
                    if flow.running == 0:  # nothing more can run in it
                        flow.close()
                        self.flows.discard(flow)
                if not self.running:
                    break
                flow, i, item, final, decoupled = await self.events.get()
                if final:
                    flow.running -= 1
                    self.running -= 1
                if isinstance(item, TritonShmError):
                    self.error = self.error or self.scheduler.step_error(i, item)
                elif item is not None:
                    held = _Held(item)
                    held.readers += 1  # ours until a flow takes it
                    if self.error is None:
                        made: dict[str, Tensor] = {steps[i].output_map[o.name]: o for o in item.outputs
                                                   if o.name in steps[i].output_map}
                        if decoupled:
                            child = flow.fork(held, made)
                            self.flows.add(child)
                            todo.append(child)
                        else:
                            flow.add(held, made)
                    held.drop()
                if final or item is not None:
                    todo.append(flow)
        finally:
            self._stop()
        self.stream.queue.put_nowait((self.error, True))  # the final flag, alone or with the error

    async def _dispatch(self, flow: _Flow) -> None:
        limiters = self.scheduler._limiters
        for i, step in enumerate(self.scheduler.steps):
            inputs = step.input_map.values()
            if i in flow.started or not all(t in flow.tensors for t in inputs) or \
                    not (any(t in flow.new for t in inputs) if inputs else flow.root):
                continue
            flow.started.add(i)
            if limiters is not None:  # back-pressure: a slot of the step first
                await limiters[i].acquire()
            flow.running += 1
            self.running += 1
            task = asyncio.ensure_future(self._step(flow, i))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    def _answer(self, flow: _Flow) -> None:
        """Send ``flow``'s ensemble response once it holds every output, one made in it."""
        outputs = self.plan.outputs
        if flow.answered or not all(n in flow.tensors for n in outputs) or not any(n in flow.new for n in outputs):
            return
        flow.answered = True
        scheduler = self.scheduler
        held = [h.take() for h in flow.held]
        try:
            tensors = scheduler.outputs(flow.tensors, self.plan)
        except TritonShmError as e:
            _drop_all(held)
            self.error = self.error or e
            return
        self.stream.queue.put_nowait((InferResponse(
            model_name=scheduler.model.name, model_version=str(scheduler.model.version), id=self.request.id,
            outputs=tensors, _release=functools.partial(_drop_all, held)), False))

    async def _step(self, flow: _Flow, i: int) -> None:
        """Run step ``i`` in ``flow``; report each response, then the final flag (exactly
        once, whatever happens, but when the run is cancelled)."""
        scheduler, put = self.scheduler, self.events.put_nowait
        final = False
        try:
            model, sub = scheduler.step_request(i, flow.tensors, self.request)
            plan = validate_request(model, sub)
            if not model.decoupled:
                if self.trace is None:
                    response = await model.queue().submit(sub, plan, {})
                else:
                    response = await scheduler._run_traced_step(model, sub, self.trace)
                if response is None:
                    raise Internal(f"ensemble step model '{model.name}' answered on a stream")
                final = True
                put((flow, i, response, True, False))
                return
            stream = ResponseStream(asyncio.Queue())
            self.step_streams.add(stream)
            get: asyncio.Future | None = None
            try:
                submitted = asyncio.ensure_future(
                    model.queue().submit(sub, plan, {}, None, stream) if self.trace is None
                    else scheduler._run_traced_step(model, sub, self.trace, stream))
                while not final:
                    get = asyncio.ensure_future(stream.queue.get())
                    await asyncio.wait({get, submitted}, return_when=asyncio.FIRST_COMPLETED)
                    if not get.done():  # dispatched (or refused) before its first response
                        get.cancel()
                        submitted.result()
                        get = asyncio.ensure_future(stream.queue.get())
                    item, final = await get
                    get = None
                    put((flow, i, item, final, True))
            finally:
                self.step_streams.discard(stream)
                if get is not None and get.done() and not get.cancelled() and get.exception() is None:
                    _release_item(get.result()[0])  # taken from the stream, never reported
                while not stream.queue.empty():
                    _release_item(stream.queue.get_nowait()[0])
        except TritonShmError as e:
            if not final:
                final = True
                put((flow, i, e, True, False))
        except Exception as e:  # noqa: BLE001 - a bug must end the step, not hang the ensemble
            if not final:
                final = True
                put((flow, i, Internal(f"{type(e).__name__}: {e}"), True, False))
        finally:
            if scheduler._limiters is not None:
                scheduler._limiters[i].release()

    def _stop(self) -> None:
        """The run is over (or the client went away): stop what still runs, give back
        every response no flow or answer holds."""
        for stream in list(self.step_streams):
            if stream.cancel is not None:
                stream.cancel()  # the decoupled step's model sees is_cancelled()
        for task in list(self.tasks):
            task.cancel()
        while not self.events.empty():
            _release_item(self.events.get_nowait()[2])
        for flow in self.flows:
            flow.close()
        self.flows.clear()


def _release_item(item: object) -> None:
    if isinstance(item, InferResponse):
        item.release()


def _drop_all(held: list[_Held]) -> None:
    for h in held:
        h.drop()


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
