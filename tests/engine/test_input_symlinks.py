"""A job reads only what lies under its input: a symbolic link out of the input directory
(a secret file, a directory elsewhere) is refused at submit, never read nor uploaded;
links that stay inside the directory are followed."""

from __future__ import annotations

from pathlib import Path

import pytest

from cmr.api import run_on
from cmr.backends.base import Backend
from cmr.errors import UsageError
from cmr.settings import AwsSettings

from .reference import counts_from_parts

WORDCOUNT = "examples/wordcount.py"
SECRET = b"hunter2-secret-token"


def _input_with(tmp_path: Path) -> Path:
    data = tmp_path / "in"
    (data / "sub").mkdir(parents=True)
    (data / "a.txt").write_text("alpha beta\n")
    (data / "sub" / "b.txt").write_text("beta gamma\n")
    return data


def _secret(tmp_path: Path) -> Path:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    secret = outside / "credentials"
    secret.write_bytes(SECRET + b"\n")
    return secret


def _no_secret_under(path: Path) -> None:
    for f in path.rglob("*"):
        if f.is_file() and not f.is_symlink():
            assert SECRET not in f.read_bytes(), f"{f} holds the secret"


@pytest.mark.parametrize("where", ["top", "nested"])
async def test_link_to_a_file_outside_is_refused_and_never_read(
    embedded: Backend, tmp_path: Path, where: str
) -> None:
    data = _input_with(tmp_path)
    link = (data if where == "top" else data / "sub") / "notes.txt"
    link.symlink_to(_secret(tmp_path))
    with pytest.raises(UsageError, match="outside the input directory") as caught:
        await run_on(embedded, WORDCOUNT, str(data), str(tmp_path / "out"), reducers=2)
    assert str(link) in str(caught.value)  # names the link, so the user can act on it
    _no_secret_under(tmp_path / "out")
    assert not (tmp_path / "out" / "_SUCCESS").exists()


async def test_link_to_a_directory_outside_is_refused(embedded: Backend, tmp_path: Path) -> None:
    data = _input_with(tmp_path)
    (data / "more").symlink_to(_secret(tmp_path).parent, target_is_directory=True)
    with pytest.raises(UsageError, match=r"more is a symbolic link to .*elsewhere, outside"):
        await run_on(embedded, WORDCOUNT, str(data), str(tmp_path / "out"), reducers=2)
    _no_secret_under(tmp_path / "out")


async def test_a_chain_of_links_that_ends_outside_is_refused(
    embedded: Backend, tmp_path: Path
) -> None:
    data = _input_with(tmp_path)
    (data / "hop").symlink_to(_secret(tmp_path))  # refused even via an inside-looking hop
    (data / "sub" / "via.txt").symlink_to(data / "hop")
    with pytest.raises(UsageError, match="outside the input directory"):
        await run_on(embedded, WORDCOUNT, str(data), str(tmp_path / "out"), reducers=1)


async def test_links_that_stay_inside_are_followed(embedded: Backend, tmp_path: Path) -> None:
    data = _input_with(tmp_path)
    (data / "again.txt").symlink_to("sub/b.txt")  # relative, inside
    (data / "mirror").symlink_to(data / "sub", target_is_directory=True)
    await run_on(embedded, WORDCOUNT, str(data), str(tmp_path / "out"), reducers=2)
    # A link reads as a copy of what it points to: b.txt three times (itself, again.txt,
    # mirror/b.txt); the linked directory was not skipped for being reached twice.
    assert counts_from_parts(tmp_path / "out", 2) == {"alpha": 1, "beta": 4, "gamma": 3}


@pytest.mark.parametrize("target", ["..", "."])
async def test_a_link_to_a_directory_that_contains_it_is_refused(
    embedded: Backend, tmp_path: Path, target: str
) -> None:
    data = _input_with(tmp_path)
    (data / "sub" / "up").symlink_to(target, target_is_directory=True)  # a loop, inside
    with pytest.raises(UsageError, match="a directory that contains it: a loop") as caught:
        await run_on(embedded, WORDCOUNT, str(data), str(tmp_path / "out"), reducers=2)
    assert str(data / "sub" / "up") in str(caught.value)
    assert not (tmp_path / "out").exists()


async def test_an_input_that_is_itself_a_link_is_followed(
    embedded: Backend, tmp_path: Path
) -> None:
    data = _input_with(tmp_path)
    named = tmp_path / "named"
    named.symlink_to(data, target_is_directory=True)  # the user named it: their choice
    await run_on(embedded, WORDCOUNT, str(named), str(tmp_path / "out"), reducers=1)
    assert counts_from_parts(tmp_path / "out", 1) == {"alpha": 1, "beta": 2, "gamma": 1}


@pytest.mark.usefixtures("aws_stack")
async def test_aws_never_uploads_a_file_linked_from_outside(
    aws: tuple[Backend, AwsSettings], tmp_path: Path
) -> None:
    be, settings = aws
    data = _input_with(tmp_path)
    (data / "sub" / "notes.txt").symlink_to(_secret(tmp_path))
    with pytest.raises(UsageError, match="outside the input directory"):
        # detached, no workers: the old code staged the input and returned
        await run_on(
            be, WORDCOUNT, str(data), str(tmp_path / "out"), reducers=1, workers=0,
            detach=True, aws=settings,
        )  # fmt: skip
    bucket = f"s3://{settings.bucket}/"
    for blob in await be.blobs.list(bucket):
        assert SECRET not in await be.blobs.get(blob.url), f"{blob.url} holds the secret"
