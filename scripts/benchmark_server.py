"""Speed of the translation service: ``python scripts/benchmark_server.py checkpoint=PATH [backend=ct2
ct2_model=DIR] 'clients=[1,8]' requests=200``. Single sentences of the checkpoint's test split (or
``data.split``, or ``eval.src``) against the server on 127.0.0.1; prints a table, writes JSON."""

import json
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from nmt.benchmark.hardware import hardware
from nmt.benchmark.service_speed import benchmark_service, format_rows
from nmt.cli import run_cli
from nmt.config import register_configs
from nmt.devices import select_device
from nmt.evaluation import evaluation_text
from nmt.serve import create_app
from nmt.translator import Translator

register_configs()


@hydra.main(version_base="1.3", config_path="../configs", config_name="benchmark_server")
@run_cli
def main(cfg: DictConfig) -> None:
    cfg = OmegaConf.to_object(cfg)
    device = select_device(cfg.device)
    translator = Translator.from_checkpoint(cfg.checkpoint, device, cfg.backend, cfg.ct2_model)
    sentences = [s for s in evaluation_text(cfg, translator.cfg)[0] if s.strip()]
    app = create_app(translator, cfg.serve, translator.decoding_with(cfg.decoding))
    rows = benchmark_service(app, sentences, cfg.clients, cfg.requests)
    results = {
        "hardware": hardware(device),
        "backend": cfg.backend,
        "checkpoint": cfg.checkpoint,
        "rows": rows,
    }
    path = Path(HydraConfig.get().runtime.output_dir) / cfg.output
    path.write_text(json.dumps(results, indent=2) + "\n")
    beam = translator.decoding_with(cfg.decoding).beam_size
    print(f"{results['hardware']['cpu']}, backend {cfg.backend}, beam {beam}, {len(sentences)} sentences")
    print(format_rows(rows))
    print(f"results: {path}")


if __name__ == "__main__":
    main()
