"""The set-up many Triton users come from: one FastAPI app under uvicorn (one worker process)
serving one .onnx file through onnxruntime (CPU execution provider), speaking just enough
of the KServe V2 HTTP protocol for perf_analyzer (`-i http`):

    GET  /v2, /v2/health/live, /v2/health/ready
    GET  /v2/models/{m}, /v2/models/{m}/config
    POST /v2/models/{m}/infer   JSON tensors and the binary tensor extension

No statistics, no gRPC, no batching across requests: what a hand-written server has.

    python bench/fastapi_baseline.py --model path.onnx --name mlp --port N --max-batch-size 8

FastAPI and uvicorn are not triton-shm dependencies; bench/compare_onnx.py installs them
into bench/.cache/ref-venv (the reference venv) and runs this file with that python.
"""
from __future__ import annotations

import argparse
import json

import numpy as np
import onnxruntime as ort
import uvicorn
from fastapi import FastAPI, HTTPException, Request, Response
from starlette.concurrency import run_in_threadpool

# onnxruntime type string -> (V2 datatype, numpy dtype)
TYPES = {
    "tensor(float)": ("FP32", np.float32), "tensor(double)": ("FP64", np.float64),
    "tensor(float16)": ("FP16", np.float16), "tensor(int64)": ("INT64", np.int64),
    "tensor(int32)": ("INT32", np.int32), "tensor(int16)": ("INT16", np.int16),
    "tensor(int8)": ("INT8", np.int8), "tensor(uint8)": ("UINT8", np.uint8),
    "tensor(bool)": ("BOOL", np.bool_),
}
NUMPY = {v2: dt for v2, dt in TYPES.values()}
HEADER = "Inference-Header-Content-Length"


def make_app(model_path: str, name: str, max_batch_size: int) -> FastAPI:
    session = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    batched = max_batch_size > 0

    def shape(arg) -> list[int]:
        dims = [d if isinstance(d, int) else -1 for d in arg.shape]
        return [-1, *dims[1:]] if batched else dims

    def tensors(args) -> list[dict]:
        return [{"name": a.name, "datatype": TYPES[a.type][0], "shape": shape(a)} for a in args]

    inputs, outputs = tensors(session.get_inputs()), tensors(session.get_outputs())
    output_types = {t["name"]: t["datatype"] for t in outputs}
    metadata = {"name": name, "versions": ["1"], "platform": "onnxruntime_onnx",
                "inputs": inputs, "outputs": outputs}
    config = {"name": name, "platform": "onnxruntime_onnx", "backend": "onnxruntime", "max_batch_size": max_batch_size,
              "input": [{"name": t["name"], "data_type": f"TYPE_{t['datatype']}",
                         "dims": t["shape"][1:] if batched else t["shape"]} for t in inputs],
              "output": [{"name": t["name"], "data_type": f"TYPE_{t['datatype']}",
                          "dims": t["shape"][1:] if batched else t["shape"]} for t in outputs]}

    app = FastAPI()

    def model_or_404(m: str) -> None:
        if m != name:
            raise HTTPException(404, f"unknown model '{m}'")

    @app.get("/v2")
    def server_metadata():
        return {"name": "fastapi-onnxruntime", "version": ort.__version__, "extensions": []}

    @app.get("/v2/health/live")
    @app.get("/v2/health/ready")
    def health():
        return Response()

    @app.get("/v2/models/{m}")
    @app.get("/v2/models/{m}/versions/{v}")
    def model_metadata(m: str, v: str = "1"):
        model_or_404(m)
        return metadata

    @app.get("/v2/models/{m}/ready")
    @app.get("/v2/models/{m}/versions/{v}/ready")
    def model_ready(m: str, v: str = "1"):
        model_or_404(m)
        return Response()

    @app.get("/v2/models/{m}/config")
    @app.get("/v2/models/{m}/versions/{v}/config")
    def model_config(m: str, v: str = "1"):
        model_or_404(m)
        return config

    @app.post("/v2/models/{m}/infer")
    @app.post("/v2/models/{m}/versions/{v}/infer")
    async def infer(m: str, request: Request, v: str = "1"):
        model_or_404(m)
        body = await request.body()
        length = request.headers.get(HEADER)
        header_len = int(length) if length is not None else len(body)
        req = json.loads(body[:header_len])
        blob, offset = memoryview(body)[header_len:], 0
        feeds = {}
        for t in req["inputs"]:
            dtype = NUMPY[t["datatype"]]
            size = (t.get("parameters") or {}).get("binary_data_size")
            if size is not None:
                arr = np.frombuffer(blob[offset:offset + size], dtype=dtype)
                offset += size
            else:
                arr = np.asarray(t["data"], dtype=dtype)
            feeds[t["name"]] = arr.reshape(t["shape"])
        binary_default = bool((req.get("parameters") or {}).get("binary_data_output", False))
        wanted = req.get("outputs") or [{"name": n} for n in output_types]
        names = [o["name"] for o in wanted]
        results = await run_in_threadpool(session.run, names, feeds)

        out, chunks = [], []
        for o, arr in zip(wanted, results):
            desc = {"name": o["name"], "datatype": output_types[o["name"]], "shape": list(arr.shape)}
            if (o.get("parameters") or {}).get("binary_data", binary_default):
                raw = np.ascontiguousarray(arr).tobytes()
                desc["parameters"] = {"binary_data_size": len(raw)}
                chunks.append(raw)
            else:
                desc["data"] = arr.reshape(-1).tolist()
            out.append(desc)
        resp = {"model_name": name, "model_version": "1", "outputs": out}
        if "id" in req:
            resp["id"] = req["id"]
        head = json.dumps(resp).encode()
        if not chunks:
            return Response(head, media_type="application/json")
        return Response(b"".join([head, *chunks]), media_type="application/octet-stream",
                        headers={HEADER: str(len(head))})

    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True, help="path to the .onnx file")
    parser.add_argument("--name", required=True, help="model name in the URLs")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-batch-size", type=int, default=0)
    args = parser.parse_args()
    app = make_app(args.model, args.name, args.max_batch_size)
    uvicorn.run(app, host="127.0.0.1", port=args.port, workers=1, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
