"""How a run starts: every script's config and --help, launchers and sweeps, the main job."""
