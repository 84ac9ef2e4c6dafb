"""The bundle: its contract (manifest.json) and its assembly (model, runner, golden data)."""
