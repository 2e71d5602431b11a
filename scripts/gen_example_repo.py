"""Write the example model repository: ``python scripts/gen_example_repo.py DIR``.

Models: ``add_sub`` (Triton's ``simple``, FP32 [16], max_batch_size 8),
``identity_fp32`` and ``identity_bytes`` (dims [-1]), ``mlp`` (a ~10 ms/sample
CPU model for batching and scaling runs), an ensemble, and Python models:
``py_preprocess`` (text pre-processing), ``py_add_sub`` and ``py_chain`` (a BLS
pipeline of two ``py_add_sub`` steps), ``py_tokens`` (a decoupled model that
streams a text word by word), ``py_echo_text`` (one response, for generate) and
``py_llm`` (a decoupled language model by a fixed rule, following Triton's LLM
conventions: what the OpenAI port serves).  Generated rather than checked in so the
repository holds no binaries; rerunning overwrites the same files.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from scripts import example_models as em, llm_models, python_models as pm


def generate(repo: pathlib.Path) -> list[pathlib.Path]:
    """Write every example model into ``repo``; returns the model directories."""
    repo.mkdir(parents=True, exist_ok=True)
    return [
        em.add_sub(repo),
        em.identity(repo, "FP32"),
        em.identity(repo, "BYTES"),
        em.mlp(repo),
        em.add_sub_ensemble(repo),
        pm.preprocess(repo),
        pm.add_sub(repo),
        pm.bls_chain(repo),
        pm.tokens(repo),
        pm.echo_text(repo),
        llm_models.text_llm(repo),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=pathlib.Path, help="model repository to write (created if missing)")
    parser.add_argument("--no-timing", action="store_true", help="skip timing the mlp with onnxruntime")
    args = parser.parse_args(argv)

    for model_dir in generate(args.dir):
        files = sorted(p for p in model_dir.rglob("*") if p.is_file())
        size = sum(p.stat().st_size for p in files)
        print(f"{model_dir}: {', '.join(str(p.relative_to(model_dir)) for p in files)} ({size / 1e6:.1f} MB)")
        if model_dir.name == "mlp" and not args.no_timing:
            ms = em.time_mlp_ms(model_dir, batch=1)
            print(f"  mlp: {ms:.2f} ms per sample at batch 1 (onnxruntime, 1 intra-op thread)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
