"""DNSMOS's two ONNX graphs run by torch, for a CUDA device whose onnxruntime has no CUDA provider
(onnxruntime-gpu is a separate wheel): the files are read with a protobuf wire reader of our own
(no `onnx` package) and executed node by node with torch ops.

Only the ops those graphs use are implemented (OPS); any other is an error naming it. `run(None,
{"input_1": x})` mirrors onnxruntime's `InferenceSession.run`, so `DnsmosScorer` takes either.

`half`: the 2-D convolutions (nearly all of DNSMOS's arithmetic) in float16, channels-last, their
activations kept float16 up to the dense head, which runs float32 as every op before the first
convolution (the models' own STFT and log). On CUDA, `graphs` replays each input shape's whole
graph from a CUDA graph (captured at its first call), so a call launches one graph, not a kernel
per node from Python: the scoring thread holds the GIL less while the decode loop wants it.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..device import CAPTURE_LOCK

_DTYPES = {1: "<f4", 6: "<i4", 7: "<i8"}  # ONNX TensorProto data types: float, int32, int64


def _varint(b: bytes, i: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        c = b[i]
        i += 1
        out |= (c & 0x7F) << shift
        shift += 7
        if c < 0x80:
            return out, i


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _fields(b: bytes):
    """(field number, wire type, value) of one protobuf message."""
    i = 0
    while i < len(b):
        key, i = _varint(b, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(b, i)
        elif wire == 1:
            value, i = b[i:i + 8], i + 8
        elif wire == 2:
            n, i = _varint(b, i)
            value, i = b[i:i + n], i + n
        elif wire == 5:
            value, i = b[i:i + 4], i + 4
        else:
            raise ValueError(f"protobuf wire type {wire} is not read here")
        yield field, wire, value


def _ints(wire: int, value) -> list[int]:
    """A repeated int64 field's entries: packed (wire 2) or one."""
    if wire != 2:
        return [_signed(value)]
    out, i = [], 0
    while i < len(value):
        v, i = _varint(value, i)
        out.append(_signed(v))
    return out


def _tensor(b: bytes) -> tuple[str, np.ndarray]:
    dims, dtype, name, raw, floats, int64s = [], 1, "", None, [], []
    for field, wire, value in _fields(b):
        if field == 1:
            dims += _ints(wire, value)
        elif field == 2:
            dtype = value
        elif field == 8:
            name = value.decode()
        elif field == 9:
            raw = value
        elif field == 4:
            floats += list(np.frombuffer(value, "<f4")) if wire == 2 else [struct.unpack("<f", value)[0]]
        elif field == 7:
            int64s += _ints(wire, value)
    if dtype not in _DTYPES:
        raise ValueError(f"ONNX tensor {name!r}: data type {dtype} is not read here")
    if raw is not None:
        arr = np.frombuffer(raw, _DTYPES[dtype]).copy()
    else:
        arr = np.asarray(floats if dtype == 1 else int64s, dtype=_DTYPES[dtype])
    return name, arr.reshape(dims)


def _attribute(b: bytes) -> tuple[str, object]:
    name, value, ints = "", None, []
    for field, wire, v in _fields(b):
        if field == 1:
            name = v.decode()
        elif field == 2:
            value = struct.unpack("<f", v)[0]
        elif field == 3:
            value = _signed(v)
        elif field == 4:
            value = v.decode()
        elif field == 8:
            ints += _ints(wire, v)
    return name, ints if ints else value


def read_graph(path: str | Path) -> tuple[list, dict, str, str]:
    """(nodes as (op, inputs, outputs, attributes), initializers by name, input name, output name)."""
    model = Path(path).read_bytes()
    graph = next(v for field, _, v in _fields(model) if field == 7)
    nodes, inits, inputs, outputs = [], {}, [], []
    for field, _, v in _fields(graph):
        if field == 1:
            op, ins, outs, attrs = "", [], [], {}
            for f, _, x in _fields(v):
                if f == 1:
                    ins.append(x.decode())
                elif f == 2:
                    outs.append(x.decode())
                elif f == 4:
                    op = x.decode()
                elif f == 5:
                    k, a = _attribute(x)
                    attrs[k] = a
            nodes.append((op, ins, outs, attrs))
        elif field == 5:
            name, arr = _tensor(v)
            inits[name] = arr
        elif field in (11, 12):
            (inputs if field == 11 else outputs).append(next(x.decode() for f, _, x in _fields(v) if f == 1))
    return nodes, inits, inputs[0], outputs[0]


def _slice(x, starts, ends, axes=None, steps=None):
    index = [slice(None)] * x.dim()
    axes = range(len(starts)) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    for s, e, a, st in zip(starts.tolist(), ends.tolist(), axes.tolist() if hasattr(axes, "tolist") else axes,
                           steps.tolist() if hasattr(steps, "tolist") else steps):
        index[a] = slice(int(s), min(int(e), x.shape[a]), int(st))
    return x[tuple(index)]


def _conv(x, w, b=None, auto_pad="NOTSET", pads=None, strides=None, dilations=None, group=1, **_):
    if w.dim() == 4 and w.dtype != x.dtype:  # a half graph's convolution: its input into the weights' layout
        x = x.to(w.dtype, memory_format=torch.channels_last)
    if auto_pad not in ("NOTSET", "VALID"):
        raise ValueError(f"Conv auto_pad {auto_pad!r} is not run here")
    pad = 0 if auto_pad == "VALID" or pads is None else pads[: len(pads) // 2]
    if pads is not None and auto_pad == "NOTSET" and pads[: len(pads) // 2] != pads[len(pads) // 2:]:
        raise ValueError(f"Conv pads {pads}: asymmetric padding is not run here")
    conv = F.conv1d if w.dim() == 3 else F.conv2d
    return conv(x, w, b, stride=strides or 1, padding=pad, dilation=dilations or 1, groups=group)


def _maxpool(x, kernel_shape, strides=None, pads=None, auto_pad="NOTSET", ceil_mode=0, **_):
    if pads and any(pads):
        raise ValueError(f"MaxPool pads {pads} are not run here")
    return F.max_pool2d(x, kernel_shape, strides or kernel_shape, ceil_mode=bool(ceil_mode))


def _unsqueeze(x, axes):
    for axis in sorted(a % (x.dim() + len(axes)) for a in axes):  # ONNX: axes of the output
        x = x.unsqueeze(axis)
    return x


OPS = {
    "Slice": lambda a, *x: _slice(*x),
    "Reshape": lambda a, x, shape: x.reshape([x.shape[i] if s == 0 else int(s) for i, s in enumerate(shape.tolist())]),
    "Concat": lambda a, *x: torch.cat(x, dim=a["axis"]),
    "Transpose": lambda a, x: x.permute(*a["perm"]),
    "Conv": lambda a, *x: _conv(*x, **a),
    "Mul": lambda a, x, y: x * y,
    "Add": lambda a, x, y: x + y,
    "Div": lambda a, x, y: x / y,
    "Sqrt": lambda a, x: torch.sqrt(x),
    "Pow": lambda a, x, y: torch.pow(x, y),
    "Max": lambda a, x, y: torch.maximum(x, y),
    "Log": lambda a, x: torch.log(x),
    "Unsqueeze": lambda a, x: _unsqueeze(x, a["axes"]),
    "Relu": lambda a, x: torch.relu(x),
    "MaxPool": lambda a, x: _maxpool(x, **a),
    "ReduceMax": lambda a, x: torch.amax(x, dim=a["axes"], keepdim=bool(a.get("keepdims", 1))),
    "MatMul": lambda a, x, y: x.float() @ y,  # a half graph's head runs float32
}


class TorchGraph:
    """An ONNX graph of OPS on a torch device, float32 (or half convolutions); `run` as onnxruntime's session."""

    def __init__(self, path: str | Path, device: str = "cpu", half: bool = False, graphs: bool = False):
        self.device = torch.device(device)
        self.half = bool(half)
        self.graphs = bool(graphs) and self.device.type == "cuda"
        self.nodes, inits, self.input, self.output = read_graph(path)
        for op, *_ in self.nodes:
            if op not in OPS:
                raise ValueError(f"{path}: ONNX op {op} is not run by the torch executor")
        conv_weights = {ins[1] for op, ins, *_ in self.nodes if op == "Conv" and inits[ins[1]].ndim == 4}
        conv_biases = {ins[2] for op, ins, *_ in self.nodes if op == "Conv" and ins[1] in conv_weights and len(ins) > 2}
        # int64 initializers (shapes, slice bounds) stay on the host; weights go to the device
        self.inits = {}
        for k, v in inits.items():
            t = torch.from_numpy(v)
            if v.dtype == np.float32:
                t = t.to(self.device)
                if self.half and k in conv_weights:
                    t = t.to(torch.float16, memory_format=torch.channels_last)
                elif self.half and k in conv_biases:
                    t = t.to(torch.float16)
            self.inits[k] = t
        self._graphs: dict[tuple, tuple] = {}  # input shape -> (graph, its input, its output)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x float32 on the device -> the graph's output, float32 on the device."""
        values = dict(self.inits)
        values[self.input] = x
        for op, ins, outs, attrs in self.nodes:
            values[outs[0]] = OPS[op](attrs, *[values[i] for i in ins])
        return values[self.output].float()

    def _captured(self, shape: tuple) -> tuple:
        static_in = torch.zeros(shape, dtype=torch.float32, device=self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with CAPTURE_LOCK, torch.cuda.stream(side):  # warm-up off the capture: cuDNN's plans, workspaces
            self.forward(static_in)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # NOTE: thread_local: the decode loop's thread keeps launching while this (scoring) thread captures
        with CAPTURE_LOCK, torch.cuda.graph(graph, capture_error_mode="thread_local"):
            static_out = self.forward(static_in)
        return graph, static_in, static_out

    @torch.inference_mode()
    def run(self, _outputs, feeds: dict) -> list[np.ndarray]:
        x = torch.as_tensor(feeds[self.input], dtype=torch.float32).to(self.device)
        if not self.graphs:
            return [self.forward(x).cpu().numpy()]
        key = tuple(x.shape)
        if key not in self._graphs:
            self._graphs[key] = self._captured(key)
        graph, static_in, static_out = self._graphs[key]
        static_in.copy_(x)
        graph.replay()
        return [static_out.cpu().numpy()]
