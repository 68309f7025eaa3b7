"""What every cmr command shares: the consoles, the one-line error exit, and the options
that name where cmr keeps things on AWS."""

from __future__ import annotations

from typing import Annotated, NoReturn

import typer
from rich.console import Console

err = Console(stderr=True, soft_wrap=True)  # an error message must stay greppable
out = Console()


def fail(message: str, code: int = 1) -> NoReturn:
    """Print one ``error:`` line (no traceback) and exit with ``code``."""
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


Bucket = Annotated[str, typer.Option(help="S3 bucket for staging, scratch and output")]
TableName = Annotated[str, typer.Option("--table", help="DynamoDB table for job state")]
QueuePrefix = Annotated[str, typer.Option(help="prefix of every queue cmr creates")]
Region = Annotated[str | None, typer.Option(help="AWS region (default: AWS config)")]
Profile = Annotated[str | None, typer.Option(help="AWS profile (default: AWS config)")]
Verbose = Annotated[int, typer.Option("--verbose", "-v", count=True, help="more log output")]
