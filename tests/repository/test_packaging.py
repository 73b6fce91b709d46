"""The package's metadata as setuptools builds it from pyproject.toml (no install, no network): the license as an SPDX
expression (PEP 639: setuptools deprecates the `project.license` table and refuses it from February 2027) and the
`tensorboard` user extra at dev's bound."""

import email
import subprocess
import sys
from email.message import Message
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
BUILD = "import sys; from setuptools import build_meta; build_meta.prepare_metadata_for_build_wheel(sys.argv[1])"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Message, str]:
    """The wheel METADATA setuptools writes for the checkout, and everything the build printed."""
    out = tmp_path_factory.mktemp("metadata")
    result = subprocess.run([sys.executable, "-c", BUILD, str(out)], cwd=ROOT, capture_output=True, text=True,
                            timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    (metadata,) = out.glob("*.dist-info/METADATA")
    return email.message_from_string(metadata.read_text()), result.stdout + result.stderr


def test_the_license_is_an_spdx_expression_and_setuptools_deprecates_nothing(built):
    metadata, output = built
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata["License"] is None  # the deprecated field the table form writes
    assert "SetuptoolsDeprecationWarning" not in output, output[-3000:]  # what the table form prints


def test_tensorboard_is_a_user_extra_at_devs_bound(built):
    metadata, _ = built
    requirements = metadata.get_all("Requires-Dist")
    assert "tensorboard" in metadata.get_all("Provides-Extra")
    assert 'tensorboard>=2.14; extra == "tensorboard"' in requirements
    assert 'tensorboard>=2.14; extra == "dev"' in requirements
