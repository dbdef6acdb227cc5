"""A built graph run as a chain of sessions, each over a run of its layers, so that checking a graph never holds
more than CHUNK_BYTES of its weights: each piece is cut from the graph file itself (onnx's Extractor on the graph
without its data: the nodes between the residual stream entering the run and the one leaving it, the pieces
reading the graph's own external data file in place), opened, run and closed in turn, the residual stream and
each layer's cache handed from one to the next. The first piece holds the embeddings; the final norm and the head
are a piece of their own. What layer_check.py runs the fp32 graphs of a model too large for one session in. No torch
here."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from gptport import contract
from gptport.runtime.onnx_engine import ORT_FAILURES
from gptport.weights import shapes_of

CHUNK_BYTES = 2**30  # float32 weight bytes of the layers one piece holds (at least one layer)


class ChainFailed(Exception):
    """onnxruntime refused a call of chain `chain` of Chunked.chains (the error is the cause)."""

    def __init__(self, chain: int) -> None:
        super().__init__(f"chain {chain}")
        self.chain = chain


def ranges(n_layer: int, layer_bytes: int, budget: int = CHUNK_BYTES) -> list[tuple[int, int]]:
    """Runs [a, b) of layers whose weights (`layer_bytes` a layer) fit `budget`, one layer at the least."""
    per = max(1, budget // max(layer_bytes, 1))
    return [(a, min(a + per, n_layer)) for a in range(0, n_layer, per)]


def layer_bytes(weights: Mapping[str, np.ndarray]) -> int:
    """float32 bytes of layer 0's weights (each layer's are the same)."""
    return sum(4 * int(np.prod(shape)) for k, shape in shapes_of(weights).items() if k.startswith("h.0."))


class Chunked:
    """The graph at `graph` cut into pieces over `spans` of its layers at `taps` (the residual stream after each
    layer); the pieces are files beside it until close().

    Without `prepack` (the float32 graphs' parity checks) onnxruntime packs each MatMul's weight per call instead of
    copying every weight into packed form when a piece opens: the same kernels, summing in another order (the
    outputs move by float32 rounding, ~1e-6 of layer outputs of magnitude 2 at Qwen2.5-0.5B's shape, far inside the
    check's bounds), and a piece of 18 of its layers opens in 0.2 s instead of 0.9. The quantized graphs keep it:
    without it MatMulNBits runs another kernel (record 0048)."""

    def __init__(self, graph: Path, taps: Sequence[str], n_layer: int, spans: list[tuple[int, int]],
                 prepack: bool = True) -> None:
        from onnx.utils import Extractor

        self.prepack = prepack
        proto = onnx.load(str(graph), load_external_data=False)
        pasts, presents = contract.past_names(n_layer), contract.present_names(n_layer)
        cache = next(i.type.tensor_type.elem_type for i in proto.graph.input if i.name == pasts[0])
        self.cache_dtype = onnx.helper.tensor_dtype_to_np_dtype(cache)  # float32; float16, int8 where so
        stream = cache if cache == onnx.TensorProto.FLOAT16 else onnx.TensorProto.FLOAT  # the residual's type
        known = {v.name for v in [*proto.graph.value_info, *proto.graph.input, *proto.graph.output]}
        proto.graph.value_info.extend(onnx.helper.make_tensor_value_info(t, stream, None)
                                      for t in taps if t not in known)  # cut at them (behind contrib operators)
        shared = [i.name for i in proto.graph.input if i.name not in pasts]  # ids, mask, positions, lengths...
        head = [o.name for o in proto.graph.output if o.name not in presents]  # the logits
        cut = Extractor(proto)
        self.pieces: list[tuple[Path, tuple[int, int]]] = []
        cuts = [([*shared, *([taps[a - 1]] if a else []), *pasts[2 * a:2 * b]], [*taps[a:b], *presents[2 * a:2 * b]],
                 (a, b)) for a, b in spans]
        cuts.append(([*shared, taps[n_layer - 1]], head, (n_layer, n_layer)))  # the head alone: a tied one is
        for k, (inputs, outputs, span) in enumerate(cuts):  # folded to a copy of the embeddings when opened
            path = graph.with_name(f"{graph.name}.piece{k}")
            onnx.save_model(cut.extract_model(inputs, outputs), str(path))
            self.pieces.append((path, span))
        self.taps, self.pasts, self.presents = list(taps), pasts, presents

    def run(self, calls: Sequence[Mapping[str, np.ndarray]], past: Sequence[np.ndarray]
            ) -> list[tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]]:
        """Calls of the whole graph in order, each piece opened once for all of them: `calls` the inputs of each
        but the cache, `past` each layer's key and value before the first (each later call reads the one before's
        present) -> per call (the logits, the residual stream after each layer, each layer's present); `past` is
        given the graph's cache type."""
        [made] = self.chains([(calls, past)])
        return made

    def chains(self, chains: Sequence[tuple[Sequence[Mapping[str, np.ndarray]], Sequence[np.ndarray]]]
               ) -> list[list[tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]]]:
        """Independent runs (each its calls and past, as run's) through one opening of each piece: a check's cases
        and its greedy steps pay for the pieces' sessions once. Per chain, run's list."""
        out = [[(np.zeros(0, np.float32), list[np.ndarray](), list[np.ndarray]()) for _ in calls]
               for calls, _ in chains]
        for path, (a, b) in self.pieces:
            session = self._session(path)
            names, outputs = {i.name for i in session.get_inputs()}, [o.name for o in session.get_outputs()]
            for chain, ((calls, past), made) in enumerate(zip(chains, out, strict=True)):
                cache = [np.asarray(p, self.cache_dtype) for p in past[2 * a:2 * b]]
                for c, feeds in enumerate(calls):
                    logits, hidden, present = made[c]
                    given = {**feeds, **({self.taps[a - 1]: hidden[-1]} if a else {}),
                             **dict(zip(self.pasts[2 * a:2 * b], cache, strict=True))}
                    if a == b:  # the head's piece reads the last layer's output
                        given[self.taps[-1]] = hidden[-1]
                    try:
                        got = dict(zip(outputs, session.run(None, {k: v for k, v in given.items() if k in names}),
                                       strict=True))
                    except (RuntimeError, *ORT_FAILURES) as e:
                        raise ChainFailed(chain) from e
                    cache = [got[n] for n in self.presents[2 * a:2 * b]]
                    made[c] = (got.get(contract.LOGITS, logits), hidden + [got[t] for t in self.taps[a:b]],
                               present + cache)
            del session  # its weights go before the next piece's come
        return out

    def _session(self, path: Path) -> Any:
        """A CPU session over one piece, without onnxruntime's weight prepacking where self.prepack is off."""
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.log_severity_level = 3  # errors only: TensorScatter's note that it copies a cache not bound in place
        if not self.prepack:
            opts.add_session_config_entry("session.disable_prepacking", "1")
        return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])

    def each(self, calls: Sequence[Mapping[str, np.ndarray]], past: Sequence[np.ndarray]
             ) -> Iterator[tuple[int, np.ndarray]]:
        """Independent calls of the whole graph, each from the same `past` (each layer's key and value), every piece
        opened once for all of them and asked only for the residual stream it hands on -> (call, its logits) as the
        head's piece makes them. Only each call's residual stream is kept between pieces (the gate's windows); `past`
        is given the graph's cache type."""
        hidden: list[np.ndarray] = [np.zeros(0, np.float32) for _ in calls]  # (B, T, D) each, after the last piece
        for path, (a, b) in self.pieces:
            session = self._session(path)
            names = {i.name for i in session.get_inputs()}
            want = contract.LOGITS if a == b else self.taps[b - 1]
            for c, feeds in enumerate(calls):
                given = {**feeds, **({self.taps[a - 1]: hidden[c]} if a else {}),
                         **{n: np.asarray(p, self.cache_dtype) for n, p in zip(self.pasts[2 * a:2 * b],
                                                                              past[2 * a:2 * b], strict=True)}}
                [got] = session.run([want], {k: v for k, v in given.items() if k in names})
                if a == b:
                    yield c, got
                else:
                    hidden[c] = got
            del session  # its weights go before the next piece's come

    def close(self) -> None:
        for path, _ in self.pieces:
            path.unlink(missing_ok=True)
