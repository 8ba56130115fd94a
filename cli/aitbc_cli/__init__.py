"""The `aitbc` command-line interface (typer + rich): parse, call the SDK, render."""
