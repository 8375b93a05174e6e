"""Speed of the translation service: ``python scripts/benchmark_server.py checkpoint=PATH [backend=ct2
ct2_model=DIR] ['clients=[1,8,32]'] ['sentences=[1,16]'] [requests=200] [serve.workers=N ...]``.

Starts ``scripts/serve.py`` (with this config's checkpoint, backend, ``decoding.*`` and ``serve.*``) in a
process of its own on 127.0.0.1 and sends it requests of the checkpoint's test split (or ``data.split``,
or ``eval.src``) from this process: requests/s, sentences/s and latency percentiles per row; with
backend=ct2 also the same requests decoded by CTranslate2 in this process. Prints tables, writes JSON.
"""

import json
from dataclasses import asdict, replace
from pathlib import Path

import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from nmt.benchmark.hardware import hardware
from nmt.benchmark.service_speed import (
    Server,
    benchmark_direct,
    benchmark_service,
    format_rows,
    serve_command,
)
from nmt.ct2.backend import CT2Backend
from nmt.devices import select_device, usable_cores
from nmt.evaluation.evaluate import evaluation_text
from nmt.inference.translator import Translator
from nmt.runs.cli import script_main
from nmt.serve.live import free_port

SERVE = Path(__file__).resolve().parent / "serve.py"


@script_main("benchmark_server")
def main(cfg: DictConfig) -> None:
    cfg = OmegaConf.to_object(cfg)
    device = select_device(cfg.device)
    translator = Translator.from_checkpoint(cfg.checkpoint, device)  # the sentences and their ids
    sentences = [s for s in evaluation_text(cfg, translator.cfg)[0] if s.strip()]
    decoding = translator.decoding_with(cfg.decoding)
    workers = cfg.serve.workers or (usable_cores() if device.type == "cpu" else 1)
    port = free_port()
    with Server(serve_command(SERVE, cfg, port, cfg.serve, cfg.decoding), port) as server:
        rows = benchmark_service(server.url, sentences, cfg.clients, cfg.sentences, cfg.requests)
    results = {
        "hardware": hardware(device),
        "backend": cfg.backend,
        "checkpoint": cfg.checkpoint,
        "decoding": asdict(decoding),
        "serve": asdict(replace(cfg.serve, workers=workers)),
        "rows": rows,
    }
    print(
        f"{results['hardware']['cpu']}, backend {cfg.backend}, beam {decoding.beam_size}, "
        f"{workers} worker(s) x {cfg.serve.threads} thread(s), {len(sentences)} sentences"
    )
    print(format_rows(rows))
    if cfg.backend == "ct2":
        backend = CT2Backend(cfg.ct2_model, translator.tokenizer, device, workers, cfg.serve.threads)
        torch.set_num_threads(1)  # this process only calls CTranslate2, whose threads are its own
        ids = [s for s in translator.encode(sentences) if s]
        direct = benchmark_direct(backend, ids, decoding, cfg.sentences, sorted({1, workers}), cfg.requests)
        results["direct"] = direct
        results["overhead"] = overhead(rows, direct)
        print("CTranslate2 in this process (the same requests, one call each):")
        for row in direct:
            print(
                f"  {row['sentences_per_request']:>3} sentences/request, {row['callers']} caller(s): "
                f"{row['sentences_per_s']:.1f} sentences/s"
            )
        for row in results["overhead"]:
            print(
                f"  service overhead, {row['sentences_per_request']} sentences/request: "
                f"{row['one_client']:.0%} with one client, {row['best']:.0%} at best"
            )
    path = Path(HydraConfig.get().runtime.output_dir) / cfg.output
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"results: {path}")


def overhead(rows: list[dict], direct: list[dict]) -> list[dict]:
    """Per request size, 1 - service sentences/s over CTranslate2's alone: with one client against one
    caller (the cost per request), and best against best (the cost at full load)."""
    out = []
    for n in sorted({r["sentences_per_request"] for r in direct}):
        served = [r for r in rows if r["sentences_per_request"] == n]
        alone = [r for r in direct if r["sentences_per_request"] == n]
        one = next((r["sentences_per_s"] for r in served if r["clients"] == 1), None)
        one_direct = next(r["sentences_per_s"] for r in alone if r["callers"] == 1)
        best, best_direct = (
            max(r["sentences_per_s"] for r in served),
            max(r["sentences_per_s"] for r in alone),
        )
        out.append(
            {
                "sentences_per_request": n,
                "one_client": round(1 - one / one_direct, 3) if one is not None else None,
                "best": round(1 - best / best_direct, 3),
            }
        )
    return out


if __name__ == "__main__":
    main()
