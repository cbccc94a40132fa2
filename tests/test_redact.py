"""Redaction: secrets out, everything else unchanged."""

from __future__ import annotations

import copy

import pytest

from zdoctor.core.model import Evidence, Finding
from zdoctor.core.redact import REDACTED, is_secret_name, redact, redact_text

HF = "hf_" + "aBcDeFgHiJkLmNoPqRsTuVwXyZ01234567"
AKIA = "AKIA" + "IOSFODNN7EXAMPLE"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


@pytest.mark.parametrize("name", [
    "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_TOKEN", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN", "WANDB_API_KEY", "hf_token", "GITHUB_TOKEN", "DB_PASSWORD", "MYSQL_PWD_PASSWD",
    "client_secret", "clientSecret", "apiKey", "APIKEY", "OPENAI_API_KEY", "ssh-key", "Authorization",
    "NEPTUNE_API_TOKEN", "hftoken", "docker.credentials", "SECRET",
])
def test_secret_names(name: str):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", [
    "KEYBOARD", "MONKEY", "TOKENIZERS_PARALLELISM", "max_tokens", "unknown_keys", "PWD", "HF_HOME",
    "HF_HUB_ENABLE_HF_TRANSFER", "AWS_REGION", "AWS_DEFAULT_REGION", "WANDB_PROJECT", "WANDB_MODE",
    "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "SSH_AUTH_SOCK", "HF_TOKEN_PATH", "AWS_SHARED_CREDENTIALS_FILE",
    "hf_token_set", "KEYRING_BACKEND", "PYTHONPATH", "NCCL_IB_HCA", "tiktoken", "keyring", "secretstorage", "",
])
def test_harmless_names(name: str):
    assert not is_secret_name(name)


def test_env_dict_secrets_replaced_and_the_rest_unchanged():
    env = {
        "HF_TOKEN": HF, "HUGGING_FACE_HUB_TOKEN": HF, "AWS_ACCESS_KEY_ID": AKIA,
        "AWS_SECRET_ACCESS_KEY": AWS_SECRET, "AWS_SESSION_TOKEN": "FwoGZXIvYXdzEBAaD", "WANDB_API_KEY": "k" * 40,
        "LD_LIBRARY_PATH": "/opt/conda/lib:/usr/local/cuda/lib64", "PATH": "/usr/bin:/bin",
        "TOKENIZERS_PARALLELISM": "false", "KEYBOARD": "us", "HF_HOME": "/data/hf", "PWD": "/home/u",
        "EMPTY_TOKEN": "",
    }
    before = copy.deepcopy(env)
    out = redact(env)
    assert env == before  # the input is not touched
    secret_keys = {"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                   "AWS_SESSION_TOKEN", "WANDB_API_KEY"}
    for k, v in out.items():
        if k in secret_keys:
            assert v == REDACTED, k
        else:
            assert v == env[k], k


def test_nested_data_lists_and_argv_pairs():
    data = {"host": {"env": {"hf_token": HF}}, "facts": {"token_count": 3, "hf_token_set": True,
                                                           "api_keys": None},
            "argv": ["torchrun", "--hf-token", "abc123", "--nproc", "8", f"--wandb-api-key=zz{HF}"],
            "tuple": ("--password", "hunter2"), "creds": {"password": ["p1", "p2"], "user": "root"}}
    out = redact(data)
    assert out["host"]["env"]["hf_token"] == REDACTED
    assert out["facts"] == data["facts"]  # numbers, booleans and None carry no key material
    assert out["argv"] == ["torchrun", "--hf-token", REDACTED, "--nproc", "8", f"--wandb-api-key={REDACTED}"]
    assert out["tuple"] == ("--password", REDACTED)
    assert out["creds"] == {"password": [REDACTED, REDACTED], "user": "root"}


def test_export_lines_inside_evidence_stdout():
    stdout = (f"export HF_TOKEN={HF}\n"
              "export LD_LIBRARY_PATH=/opt/conda/lib:$LD_LIBRARY_PATH\n"
              f"declare -x AWS_SECRET_ACCESS_KEY=\"{AWS_SECRET}\"\n"
              "WANDB_API_KEY=my secret with spaces\n"
              "CUDA_HOME=/usr/local/cuda\n")
    finding = Finding("env", "warn", "environment", evidence=[Evidence(label="env", stdout=stdout)])
    out = redact(finding.to_dict())
    text = out["evidence"][0]["stdout"]
    assert HF not in text and AWS_SECRET not in text and "my secret" not in text
    assert text.splitlines() == [
        f"export HF_TOKEN={REDACTED}",
        "export LD_LIBRARY_PATH=/opt/conda/lib:$LD_LIBRARY_PATH",
        f'declare -x AWS_SECRET_ACCESS_KEY="{REDACTED}"',
        f"WANDB_API_KEY={REDACTED}",
        "CUDA_HOME=/usr/local/cuda",
    ]


@pytest.mark.parametrize("text, expected", [
    (f"token is {HF} ok", f"token is {REDACTED} ok"),
    (f"id {AKIA}.", f"id {REDACTED}."),
    ("Authorization: Bearer eyJhbGciOi.J9.x", f"Authorization: Bearer {REDACTED}"),
    ("curl -H 'Authorization: Bearer abc' https://u:pw@host/simple",
     f"curl -H 'Authorization: Bearer {REDACTED}' https://u:{REDACTED}@host/simple"),
    ('{"HF_TOKEN": "a\\"b", "HF_HOME": "/h"}', f'{{"HF_TOKEN": "{REDACTED}", "HF_HOME": "/h"}}'),
    ("{'aws_secret_access_key': 'zz', 'region': 'us'}", f"{{'aws_secret_access_key': '{REDACTED}', 'region': 'us'}}"),
    ("password: two words here\nnext", f"password: {REDACTED}\nnext"),
    ("docker run --env=HF_TOKEN=abc img", f"docker run --env=HF_TOKEN={REDACTED} img"),
    ("HF_TOKEN=abc python train.py", f"HF_TOKEN={REDACTED}"),
    ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn\n-----END OPENSSH PRIVATE KEY-----\ntail",
     f"{REDACTED}\ntail"),
    ("HF_TOKEN=", "HF_TOKEN="),
])
def test_text_forms(text: str, expected: str):
    assert redact_text(text) == expected


@pytest.mark.parametrize("text", [
    "export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/opt/conda/lib",
    "/lib/x86_64-linux-gnu/libstdc++.so.6: version `GLIBCXX_3.4.30' not found (required by op.so)",
    "      trying file=/opt/conda/lib/libcudart.so.12",
    "torch 2.3.1+cu121, cuda 12.1, nccl 2.20.5, python 3.10.14",
    "KEYBOARD=us TOKENIZERS_PARALLELISM=false max_tokens=4096",
    "https://download.pytorch.org/whl/cu121 at 12:03:44",
    "hf_hub_download(repo_id='x') HF_HOME=/data/hf",
    "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    "tiktoken==0.7.0\nkeyring==24.3.1\ntokenizers==0.19.1\nsecretstorage==3.3.3\n",
    "if key == value: pass  # key==other",
    "Traceback (most recent call last):\nKeyError: 'zero_optimization'\nTokenError: EOF in multi-line",
    "",
])
def test_harmless_text_passes_unchanged(text: str):
    assert redact_text(text) == text


def test_redaction_is_idempotent_and_copies():
    data = {"env": {"HF_TOKEN": HF}, "log": f"export HF_TOKEN={HF}\nBearer abc", "n": [1, 2.5, None, True]}
    once = redact(data)
    assert redact(once) == once
    assert once["n"] == data["n"] and once["n"] is not data["n"]


def test_remembered_texts_are_bounded_and_a_remembered_secret_is_still_reported():
    from zdoctor.core import redact as r

    text = "export HF_TOKEN=hf_abcdefghijklmnopqrstuvwx"
    first: list[str] = []
    assert r.redact_text(text, first) == "export HF_TOKEN=<redacted>"
    again: list[str] = []
    assert r.redact_text(text, again) == "export HF_TOKEN=<redacted>" and again == first  # from the memo
    for i in range(r._MEMO_TOTAL // (32 * 1024) + 2):  # more than the bound, in distinct texts
        r.redact_text(f"--n={i} " + "x" * (32 * 1024))
    assert sum(len(t) for t in r._MEMO) <= r._MEMO_TOTAL


@pytest.mark.parametrize("text", [
    "PasswordAuthentication=no",
    "passwordauthentication no",
    "StrictHostKeyChecking=accept-new",
    "basic auth: required",
    "Basic Auth: enabled",
    "unknown key: ssh_key",
    "config key: sort_key",
    "key: zero_optimization.offload_param.buffer_count",
])
def test_a_settings_name_and_a_switchs_setting_survive_as_evidence(text):
    """Setting names are not secrets, and a switch's value (no, yes, accept-new) or a setting's name under a
    field called ``key`` holds no key material: the evidence reads as the node said it."""
    assert redact_text(text) == text
    assert redact({"PasswordAuthentication": "no", "line": text}) == {"PasswordAuthentication": "no", "line": text}


@pytest.mark.parametrize("text,expected", [
    ("KEY=abc123", "KEY=<redacted>"),
    ("ssh_key = AAAAB3NzaC1yc2E", "ssh_key = <redacted>"),
    ("api_key: abc123xyz", "api_key: <redacted>"),
    ("PASSWORD=letmein", "PASSWORD=<redacted>"),
    ("Authorization: Basic dXNlcjpwYXNz", "Authorization: Basic <redacted>"),
    ("key: s3cr3t_Value", "key: <redacted>"),
])
def test_the_values_of_secret_names_still_go(text, expected):
    assert redact_text(text) == expected
