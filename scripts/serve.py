"""Translation as a service:
``python scripts/serve.py checkpoint=PATH [port=8000] [backend=ct2 ct2_model=DIR]``.

``POST /translate`` with ``{"text": ["..."], "beam_size": 5, "nbest": 1, "attention": false}``, ``GET
/health``, ``GET /info``, ``GET /metrics`` (Prometheus), and a page at ``GET /``
(http://127.0.0.1:8000/). ``checkpoint=[a.pt,b.pt]`` serves an ensemble. Limits, batching and the
worker processes: ``serve.*`` (nmt.config.ServerLimits); docs/serving.md says how to deploy it. Only
requests whose Host is the bound address or a name of localhost are answered unless
``serve.allowed_hosts`` names others. Ctrl-C finishes the requests in flight, then stops.
"""

import uvicorn
from omegaconf import DictConfig, OmegaConf

from nmt.runs.cli import script_main
from nmt.serve import create_app, listen, served_url, trusted_hosts
from nmt.serve.batch_decoding import TranslatorSpec


@script_main("serve")
def main(cfg: DictConfig) -> None:
    cfg = OmegaConf.to_object(cfg)
    sock = listen(cfg.host, cfg.port)
    spec = TranslatorSpec(cfg.checkpoint, cfg.device, cfg.backend, cfg.ct2_model)
    translator = spec.load()
    translator.choose_target(cfg.tgt_lang, cfg.src_lang, cfg.zero_shot)  # the default of requests
    hosts = trusted_hosts(cfg.serve.allowed_hosts, cfg.host)
    defaults = translator.decoding_with(cfg.decoding)
    app = create_app(translator, cfg.serve, defaults, spec, cfg.alignment_layer, hosts)
    print(f"serving on {served_url(sock)} for Host {', '.join(hosts)} (Ctrl-C stops)", flush=True)
    # The access log is the service's own (logger nmt.serve.access: status, sentences, milliseconds).
    config = uvicorn.Config(
        app, log_level="warning", access_log=False, limit_concurrency=cfg.serve.max_connections
    )
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
