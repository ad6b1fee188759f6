"""The `tea` command line.

Each command parses its options, loads what it needs and calls one library function.
Heavy imports (torch, transformers, deepspeed, vllm) happen inside the commands so that
`tea --help` stays fast.
"""

from __future__ import annotations

import typer

app = typer.Typer(
    name="tea",
    help="Post-train language models for best-of-N deployment (TEA / Prefix-TEA).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
recipes_app = typer.Typer(help="List, show and validate recipes.", no_args_is_help=True)
diagnose_app = typer.Typer(help="Diagnostics of the estimators (no model needed).", no_args_is_help=True)
app.add_typer(recipes_app, name="recipes")
app.add_typer(diagnose_app, name="diagnose")


def _fail(message: str, code: int = 2) -> None:
    """Print a one-line error to stderr and exit (no traceback for user errors)."""
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


if __name__ == "__main__":  # pragma: no cover
    app()
