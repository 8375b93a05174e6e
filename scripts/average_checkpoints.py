"""Average checkpoints: ``python scripts/average_checkpoints.py run_dir=RUN [last=5] [window=0.2]``."""

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from nmt.checkpoint import atomic_save
from nmt.errors import NMTError
from nmt.runs.cli import script_main
from nmt.tooling.average import average_checkpoints, check_average_output, last_checkpoints


@script_main("average_checkpoints")
def main(cfg: DictConfig) -> None:
    cfg = OmegaConf.to_object(cfg)
    if bool(cfg.inputs) == bool(cfg.run_dir):
        raise NMTError("give either run_dir=RUN (with last=K) or inputs=[a.pt,b.pt,...]")
    paths = (
        [Path(p) for p in cfg.inputs]
        if cfg.inputs
        else last_checkpoints(Path(cfg.run_dir), cfg.last, cfg.window)
    )
    if cfg.output:
        output = Path(cfg.output)
    elif cfg.run_dir:
        output = Path(cfg.run_dir) / "checkpoints" / "averaged.pt"
    else:
        raise NMTError("output=PATH is required with inputs=[...]")
    check_average_output(output, paths)
    atomic_save(average_checkpoints(paths), output)
    print(f"averaged {len(paths)} checkpoints ({', '.join(p.name for p in paths)}) -> {output}")


if __name__ == "__main__":
    main()
