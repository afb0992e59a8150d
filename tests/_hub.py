"""Offline stand-ins for the Hugging Face hub: tiny models and tokenizers built locally.

`fake_hub_model` writes a randomly initialised GPT-NeoX (or GPT-2) with a word-level tokenizer
into a hub cache folder, one revision per training step, in the layout `huggingface_hub` reads
with ``HF_HUB_OFFLINE=1``.  TransformerLens then loads ``EleutherAI/pythia-14m`` checkpoints
through its own code path, with no network and no mocking.

>>> import os, tempfile
>>> with tempfile.TemporaryDirectory() as cache:
...     _ = fake_hub_model(cache, "EleutherAI/pythia-14m", revisions=["step0", "step1000"])
...     sorted(os.listdir(os.path.join(cache, "models--EleutherAI--pythia-14m", "refs")))
['main', 'step0', 'step1000']
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

import torch

BOS = "<|endoftext|>"

__all__ = [
    "LoopbackHub",
    "bridge_from_hf",
    "fake_hub_model",
    "fake_legacy_tl_model",
    "legacy_buffers",
    "pointed_at",
    "saved_revisions",
    "tiny_hf_model",
    "word_tokenizer",
]


def word_tokenizer(vocab_size: int):
    """A `PreTrainedTokenizerFast` over the words ``w1 .. w{V-1}`` with BOS = EOS = id 0."""
    import tokenizers
    import transformers
    from tokenizers.models import WordLevel

    vocab = {BOS: 0, **{f"w{i}": i for i in range(1, vocab_size)}}
    tok = tokenizers.Tokenizer(WordLevel(vocab, unk_token=BOS))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=BOS, unk_token=BOS
    )


def tiny_hf_model(
    arch: str = "gpt_neox",
    vocab_size: int = 64,
    n_ctx: int = 32,
    d_model: int = 32,
    n_layers: int = 2,
    n_heads: int = 4,
    seed: int = 0,
):
    """A randomly initialised Hugging Face causal LM (``gpt_neox`` or ``gpt2``), eval mode."""
    import transformers

    torch.manual_seed(seed)
    if arch == "gpt_neox":
        cfg = transformers.GPTNeoXConfig(
            vocab_size=vocab_size,
            max_position_embeddings=n_ctx,
            hidden_size=d_model,
            num_hidden_layers=n_layers,
            num_attention_heads=n_heads,
            intermediate_size=4 * d_model,
            bos_token_id=0,
            eos_token_id=0,
        )
        model = transformers.GPTNeoXForCausalLM(cfg)
    elif arch == "gpt2":
        cfg = transformers.GPT2Config(
            vocab_size=vocab_size,
            n_positions=n_ctx,
            n_ctx=n_ctx,  # as the hub's GPT-2 configs (stanford-crfm's included) have it
            n_embd=d_model,
            n_layer=n_layers,
            n_head=n_heads,
            bos_token_id=0,
            eos_token_id=0,
        )
        model = transformers.GPT2LMHeadModel(cfg)
    else:
        raise ValueError(f"arch must be 'gpt_neox' or 'gpt2', got {arch!r}")
    return model.eval()


def fake_hub_model(
    cache_dir: str | Path,
    repo_id: str = "EleutherAI/pythia-14m",
    revisions: Sequence[str] = ("step0", "step1000", "step2000"),
    arch: str = "gpt_neox",
    tokenizer_size: int | None = None,
    **model_kwargs,
) -> Path:
    """Write one randomly initialised model per revision into a hub cache; return the repo dir.

    Every revision gets its own weights (seed = its position in `revisions`); ``main`` points
    at the last one.  `tokenizer_size`: the tokenizer's vocabulary where it is smaller than
    the model's (Pythia pads d_vocab 50304 beyond its tokenizer's 50277).  Use with
    ``HF_HUB_CACHE=cache_dir`` and ``HF_HUB_OFFLINE=1``.
    """
    repo = Path(cache_dir) / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    vocab_size = model_kwargs.setdefault("vocab_size", 64)
    tokenizer = word_tokenizer(tokenizer_size or vocab_size)
    for i, revision in enumerate(revisions):
        commit = hashlib.sha1(f"{repo_id}@{revision}".encode()).hexdigest()
        snapshot = repo / "snapshots" / commit
        model = tiny_hf_model(arch, seed=i, **model_kwargs)
        model.config.name_or_path = repo_id
        model.save_pretrained(snapshot, safe_serialization=True)
        tokenizer.save_pretrained(snapshot)
        (repo / "refs" / revision).write_text(commit)
        if i == len(revisions) - 1:
            (repo / "refs" / "main").write_text(commit)
    (repo / "fake_hub.json").write_text(json.dumps({"repo_id": repo_id, "revisions": revisions}))
    return repo


def saved_revisions(
    root: str | Path,
    revisions: Sequence[str] = ("step0", "step1000", "step2000"),
    arch: str = "gpt_neox",
    seed: int = 0,
    **model_kwargs,
) -> dict[str, Path]:
    """{revision: folder}: one randomly initialised model per revision (seed = its position,
    offset by 1000 x `seed`: another run of the recipe), each written by ``save_pretrained``
    with its tokenizer, as a hub repository holds them (serve them with `LoopbackHub`)."""
    vocab_size = model_kwargs.setdefault("vocab_size", 64)
    tokenizer = word_tokenizer(vocab_size)
    folders = {}
    for i, revision in enumerate(revisions):
        folder = Path(root) / revision
        model = tiny_hf_model(arch, seed=1000 * seed + i, **model_kwargs)
        model.save_pretrained(folder, safe_serialization=True)
        tokenizer.save_pretrained(folder)
        folders[revision] = folder
    return folders


def bridge_from_hf(hf_model, name: str = "gpt2", tokenizer_dir: str | Path | None = None):
    """A TransformerBridge around an in-memory Hugging Face model, with a local tokenizer."""
    import transformers
    from transformer_lens.model_bridge import TransformerBridge

    from scansnap_lens.models.backend import scratch_dir

    folder = Path(tokenizer_dir or scratch_dir("scansnap_tok_"))
    word_tokenizer(hf_model.config.vocab_size).save_pretrained(folder)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    return TransformerBridge.boot_transformers(name, hf_model=hf_model, tokenizer=tokenizer)


def legacy_buffers(state: dict, fields: dict, ignore: float = -1e5) -> dict:
    """`state` as a TransformerLens 1.x or 2.x ``HookedTransformer.state_dict()`` holds it:
    each attention block's buffers ``mask`` (the causal mask, bool [n_ctx, n_ctx]) and
    ``IGNORE`` (-1e5 up to 1.x, -inf later) after its parameters, in the module's order
    (TransformerLens 1.0 ``components.Attention``; 2.0 ``AbstractAttention``)."""
    out = {}
    mask = torch.tril(torch.ones(fields["n_ctx"], fields["n_ctx"])).bool()
    for key, tensor in state.items():
        out[key] = tensor
        if key.endswith(".attn.b_O"):
            out[key[: -len("b_O")] + "mask"] = mask.clone()
            out[key[: -len("b_O")] + "IGNORE"] = torch.tensor(ignore)
    return out


def fake_legacy_tl_model(
    cache_dir: str | Path,
    repo_id: str = "NeelNanda/attn-only-1l",
    labels: Sequence[int] = (0, 5_000_000, 15_000_000),
    vocab_size: int = 64,
) -> Path:
    """Write a legacy TransformerLens repository (NeelNanda's layout) into a hub cache.

    ``config.json`` holds TransformerLens fields; ``checkpoints/<name>_checkpoint_<label>.pth``
    one HookedTransformer state dict per label (seed = its position in `labels`).  The files
    are written in an order where a label that is a decimal suffix of another comes second,
    which is where a lookup by suffix goes wrong.
    """
    from scansnap_lens.models.training import initial_weights

    repo = Path(cache_dir) / ("models--" + repo_id.replace("/", "--"))
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    snapshot = repo / "snapshots" / commit
    (snapshot / "checkpoints").mkdir(parents=True, exist_ok=True)
    fields = dict(  # the training script's config, as those repositories hold it
        n_layers=1,
        d_model=16,
        d_mlp=64,
        d_head=8,
        n_heads=2,
        lr_hidden=0.002,
        lr_vector=0.001,
        batch_size_per_device=32,
        batches_per_step=1,
        seed=10000,
        save_checkpoints=True,
        debug=False,
        normalization="LN",
        max_tokens=22_000_000_000,
        n_ctx=32,
        d_vocab=vocab_size,
        tokenizer_name="NeelNanda/gpt-neox-tokenizer-digits",
        betas=[0.9, 0.99],
        weight_decay=0.05,
        dataset_name="c4+code",
        grad_norm_clip=1.0,
        act_fn="relu",
        shortformer_pos=False,
        attn_only=True,
        ln_eps=1e-5,
        lr_schedule="cosine_warmup",
        warmup_tokens=300_000_000,
        weight_init_scheme="gpt2",
    )
    (snapshot / "config.json").write_text(json.dumps(fields))
    stem = repo_id.split("/")[-1]
    weight_fields = {**fields, "normalization_type": "LN"}
    for i, label in sorted(enumerate(labels), key=lambda p: -p[1]):
        state = legacy_buffers(initial_weights(weight_fields, seed=i), weight_fields)
        torch.save(state, snapshot / "checkpoints" / f"{stem}_checkpoint_{label}.pth")
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return repo


# ------------------------------------------------------------------ a hub on the loopback
def _git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack", ".ot", ".onnx")


@contextlib.contextmanager
def pointed_at(endpoint: str):
    """This process's `huggingface_hub` online and pointed at `endpoint` while it lasts."""
    from huggingface_hub import constants

    names = ("ENDPOINT", "HUGGINGFACE_CO_URL_TEMPLATE", "HF_HUB_OFFLINE")
    saved = {n: getattr(constants, n) for n in names}
    saved_env = os.environ.get("HF_HUB_OFFLINE")
    constants.ENDPOINT = endpoint
    constants.HUGGINGFACE_CO_URL_TEMPLATE = endpoint + "/{repo_id}/resolve/{revision}/{filename}"
    constants.HF_HUB_OFFLINE = False
    os.environ["HF_HUB_OFFLINE"] = "0"
    try:
        yield endpoint
    finally:
        for name, value in saved.items():
            setattr(constants, name, value)
        if saved_env is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = saved_env


class LoopbackHub:
    """A hub-shaped HTTP server on 127.0.0.1 over folders written by ``save_pretrained``.

    It answers what `huggingface_hub` asks the hub, as the hub answers it: repository info
    at a revision (``/api/models/{repo}/revision/{rev}``, with sizes and blob ids under
    ``?blobs=true``), the recursive tree at a commit, and ``/{repo}/resolve/{rev}/{file}``
    with ``X-Repo-Commit`` and ``ETag`` (the git blob sha1); weight files are LFS files, whose
    resolve answers 302 to a CDN host (``localhost``, another host name for the same server)
    with ``X-Linked-Etag`` (sha256) and ``X-Linked-Size``, and the CDN serves byte ranges
    (a killed download resumes).  Revisions resolve to ``sha1(repo@revision)``, as
    `fake_hub_model` names them.  Every byte sent goes through one token bucket of
    `bandwidth` bytes per second (None: unthrottled), so parallel downloads share the link.

    repos: {repo_id: {revision: folder}}; mirrors: {repo_id: repo_id} of repositories whose
    commits have the hashes of another's (``git push --mirror`` keeps them).  ``sent`` counts
    bytes per (repo, revision, file);
    ``requests`` lists (method, path, Range header, time.time()); `on_chunk(repo, revision,
    file, sent_so_far, size)` is called after every chunk sent.  Point `huggingface_hub` at
    it with ``HF_ENDPOINT = hub.endpoint`` (read when huggingface_hub is imported) or `use`
    (in this process).
    """

    CHUNK = 1 << 16

    def __init__(self, repos, bandwidth: float | None = None, on_chunk=None, mirrors=None):
        import threading

        self.mirrors = dict(mirrors or {})  # {repo: the repo whose commit hashes it has}
        self.repos = {
            repo: {rev: Path(folder) for rev, folder in revisions.items()}
            for repo, revisions in repos.items()
        }
        self.bandwidth = bandwidth
        self.on_chunk = on_chunk
        self.sent: dict[tuple[str, str, str], int] = {}
        self.requests: list[tuple[str, str, str | None, float]] = []  # method, path, Range, time
        self._lock = threading.Lock()
        self._next_free = 0.0
        self._files: dict[str, dict] = {}  # sha256 -> file, for the CDN
        self._listed: dict[tuple[str, str], list[dict]] = {}
        self._server = None
        self._thread = None

    # ---------------------------------------------------------------- what the hub knows
    @staticmethod
    def commit_of(repo: str, revision: str) -> str:
        return hashlib.sha1(f"{repo}@{revision}".encode()).hexdigest()

    def commit(self, repo: str, revision: str) -> str:
        """The commit `revision` of `repo` resolves to here (a mirror's is its original's)."""
        return self.commit_of(self.mirrors.get(repo, repo), revision)

    def _revision(self, repo: str, revision: str) -> str | None:
        for name in self.repos.get(repo, {}):
            if revision in (name, self.commit(repo, name)):
                return name
        if revision == "main" and self.repos.get(repo):
            return list(self.repos[repo])[-1]
        return None

    def _entries(self, repo: str, revision: str) -> list[dict]:
        if (repo, revision) in self._listed:
            return self._listed[(repo, revision)]
        folder = self.repos[repo][revision]
        entries = []
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            data = path.read_bytes()
            entry = {
                "path": path.relative_to(folder).as_posix(),
                "size": len(data),
                "oid": _git_blob_sha1(data),
                "file": path,
            }
            if path.name.endswith(LFS_SUFFIXES):
                sha = hashlib.sha256(data).hexdigest()
                entry["lfs"] = {"oid": sha, "size": len(data), "pointerSize": 134}
            entries.append(entry)
        with self._lock:
            self._listed[(repo, revision)] = entries
        return entries

    # ---------------------------------------------------------------- serving
    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> LoopbackHub:
        import http.server
        import threading

        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def do_HEAD(self):
                hub._answer(self, body=False)

            def do_GET(self):
                hub._answer(self, body=True)

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> LoopbackHub:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def use(self):
        """Point this process's `huggingface_hub` at the server, online (a context manager):
        what ``HF_ENDPOINT`` and ``HF_HUB_OFFLINE=0`` do when set before it is imported."""
        return pointed_at(self.endpoint)

    def _send(self, handler, status: int, headers: dict, body: bytes = b"") -> None:
        handler.send_response(status)
        for key, value in headers.items():
            handler.send_header(key, str(value))
        if "Content-Length" not in headers:
            handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        if body and handler.command == "GET":
            handler.wfile.write(body)

    def _error(self, handler, code: str, status: int = 404, commit: str | None = None) -> None:
        headers = {"X-Error-Code": code, "X-Error-Message": code, "Content-Type": "text/plain"}
        if commit is not None:
            headers["X-Repo-Commit"] = commit
        self._send(handler, status, headers, code.encode())

    def _throttle(self, n: int) -> None:
        import time

        if not self.bandwidth:
            return
        with self._lock:
            start = max(time.monotonic(), self._next_free)
            self._next_free = start + n / self.bandwidth
            until = self._next_free
        delay = until - time.monotonic()
        if delay > 0:
            time.sleep(delay)

    def _answer(self, handler, body: bool) -> None:
        import time
        from urllib.parse import parse_qs, unquote, urlsplit

        url = urlsplit(handler.path)
        parts = [unquote(p) for p in url.path.strip("/").split("/")]
        self.requests.append((handler.command, url.path, handler.headers.get("Range"), time.time()))
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            return self._api(handler, parts[2:], parse_qs(url.query))
        if parts and parts[0] == "cdn" and len(parts) == 2:
            entry = self._files.get(parts[1])
            if entry is None:
                return self._error(handler, "EntryNotFound")
            return self._file(handler, entry, {}, body)
        if len(parts) >= 5 and parts[2] == "resolve":
            repo, revision, file = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
            name = self._revision(repo, revision)
            if name is None:
                code = "RepoNotFound" if repo not in self.repos else "RevisionNotFound"
                return self._error(handler, code, 404 if code == "RevisionNotFound" else 401)
            commit = self.commit(repo, name)
            entry = next((e for e in self._entries(repo, name) if e["path"] == file), None)
            if entry is None:
                return self._error(handler, "EntryNotFound", commit=commit)
            entry = {**entry, "repo": repo, "revision": name}
            if "lfs" in entry:  # the hub sends LFS files from its CDN
                self._files[entry["lfs"]["oid"]] = entry
                cdn = f"http://localhost:{self._server.server_address[1]}/cdn/{entry['lfs']['oid']}"
                return self._send(
                    handler,
                    302,
                    {
                        "Location": cdn,
                        "X-Repo-Commit": commit,
                        "X-Linked-Etag": f'"{entry["lfs"]["oid"]}"',
                        "X-Linked-Size": entry["size"],
                        "ETag": f'"{entry["oid"]}"',
                    },
                )
            return self._file(handler, entry, {"X-Repo-Commit": commit}, body)
        return self._error(handler, "RepoNotFound", 401)

    def _api(self, handler, parts: list[str], query: dict) -> None:
        import json as _json

        repo = "/".join(parts[:2])
        if repo not in self.repos:
            return self._error(handler, "RepoNotFound", 401)
        kind = parts[2] if len(parts) > 2 else "revision"
        revision = "/".join(parts[3:]) if len(parts) > 3 else "main"
        inside = ""  # tree/{rev}/{path}: the entries under a folder of the repository
        if kind == "tree" and len(parts) > 4:
            revision, inside = parts[3], "/".join(parts[4:]).strip("/") + "/"
        name = self._revision(repo, revision)
        if name is None:
            return self._error(handler, "RevisionNotFound")
        commit = self.commit(repo, name)
        entries = self._entries(repo, name)
        if kind == "tree":
            data = [
                {
                    "type": "file",
                    "oid": e["oid"],
                    "size": e["size"],
                    "path": e["path"],
                    **({"lfs": e["lfs"]} if "lfs" in e else {}),
                }
                for e in entries
                if e["path"].startswith(inside)
            ]
            if inside and not data:  # the hub: no such folder at this revision
                return self._error(handler, "EntryNotFound", commit=commit)
        elif kind == "revision":
            blobs = query.get("blobs", ["false"])[0].lower() == "true"
            siblings = []
            for e in entries:
                sibling = {"rfilename": e["path"]}
                if blobs:
                    sibling.update(size=e["size"], blobId=e["oid"])
                    if "lfs" in e:
                        sibling["lfs"] = {
                            "sha256": e["lfs"]["oid"],
                            "size": e["size"],
                            "pointerSize": 134,
                        }
                siblings.append(sibling)
            data = {
                "id": repo,
                "modelId": repo,
                "sha": commit,
                "private": False,
                "disabled": False,
                "gated": False,
                "tags": [],
                "downloads": 0,
                "likes": 0,
                "siblings": siblings,
            }
        else:
            return self._error(handler, "EntryNotFound")
        self._send(
            handler,
            200,
            {"Content-Type": "application/json", "X-Repo-Commit": commit},
            _json.dumps(data).encode(),
        )

    def _file(self, handler, entry: dict, headers: dict, body: bool) -> None:
        data = entry["file"].read_bytes()
        size = len(data)
        start, status = 0, 200
        spec = handler.headers.get("Range")
        if spec and spec.startswith("bytes="):
            first = spec[len("bytes=") :].split("-")[0]
            start = int(first) if first else 0
            if start >= size:
                return self._send(handler, 416, {"Content-Range": f"bytes */{size}"})
            status = 206
            headers = {**headers, "Content-Range": f"bytes {start}-{size - 1}/{size}"}
        etag = entry["lfs"]["oid"] if "lfs" in entry else entry["oid"]
        headers = {
            **headers,
            "ETag": f'"{etag}"',
            "Accept-Ranges": "bytes",
            "Content-Length": size - start,
            "Content-Type": "application/octet-stream",
        }
        handler.send_response(status)
        for key, value in headers.items():
            handler.send_header(key, str(value))
        handler.end_headers()
        if not body:
            return
        key = (entry.get("repo", ""), entry.get("revision", ""), entry["path"])
        sent = start
        while sent < size:
            chunk = data[sent : sent + self.CHUNK]
            self._throttle(len(chunk))
            try:
                handler.wfile.write(chunk)
            except (BrokenPipeError, ConnectionResetError):
                return
            sent += len(chunk)
            with self._lock:
                self.sent[key] = self.sent.get(key, 0) + len(chunk)
            if self.on_chunk is not None:
                self.on_chunk(key[0], key[1], key[2], sent, size)
