"""Translation as a service:
``python scripts/serve.py checkpoint=PATH [port=8000] [backend=ct2 ct2_model=DIR]``.

``POST /translate`` with ``{"text": ["..."], "beam_size": 5, "nbest": 1, "attention": false}``, ``GET
/health``, ``GET /info``, and a page at ``GET /`` (http://127.0.0.1:8000/). ``checkpoint=[a.pt,b.pt]``
serves an ensemble. Limits and batching: ``serve.*`` (nmt.config.ServerLimits).
"""

import hydra
import uvicorn
from omegaconf import DictConfig, OmegaConf

from nmt.cli import run_cli
from nmt.config import SERVE_RULES, check_values, register_configs
from nmt.devices import select_device
from nmt.serve import create_app
from nmt.translator import Translator

register_configs()


@hydra.main(version_base="1.3", config_path="../configs", config_name="serve")
@run_cli
def main(cfg: DictConfig) -> None:
    cfg = OmegaConf.to_object(cfg)
    check_values(cfg, SERVE_RULES)
    translator = Translator.from_checkpoint(
        cfg.checkpoint, select_device(cfg.device), backend=cfg.backend, ct2_model=cfg.ct2_model
    )
    app = create_app(translator, cfg.serve, translator.decoding_with(cfg.decoding))
    print(f"serving on http://{cfg.host}:{cfg.port}/ (Ctrl-C stops)", flush=True)
    uvicorn.run(app, host=cfg.host, port=cfg.port, log_level="warning")


if __name__ == "__main__":
    main()
