"""README.md's Python example of "Data on an object store", pasted into a plain script, runs
against an S3 server (moto, started in the test): the bucket and prefix are the test's, the
endpoint and credentials come from the environment as the README says."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import detloader
from detloader.annotations.writers.pack import write_pack

README = Path(__file__).resolve().parents[2] / "README.md"
URL = '"s3://my-bucket/voc"'


def stream_example() -> str:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Data on an object store"):]
    section = section[: section.index("\n## ", 1)]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1, "README.md's 'Data on an object store' has no (or more than one) python example"
    return blocks[0]


def test_readme_stream_example_runs_as_a_plain_script(small_synth_root, s3, tmp_path):
    url = s3.upload(write_pack(detloader.read_annotations(small_synth_root), tmp_path / "pack"), "readme")
    code = stream_example()
    assert URL in code
    script = tmp_path / "example.py"
    script.write_text(code.replace(URL, repr(url)), encoding="utf-8")
    env = {**os.environ, "DETLOADER_CACHE_DIR": str(tmp_path / "cache")}  # AWS_ENDPOINT_URL: the server
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "images 24 drawn" in proc.stdout
    fetched = {p.rsplit("/", 1)[-1] for p, _ in s3.gets("/readme/")}
    assert any(name.startswith("chunk-") for name in fetched)  # the images came from the server
    assert any((tmp_path / "stream-cache").glob("pack-*/shards/chunk-*.bin"))
