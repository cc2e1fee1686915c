"""The floor of bench_online.py: ``daskhps export``'s output served by a minimal tornado handler,
written as a user would write it naively.

    python scripts/_online_floor.py EXPORT_DIR PORT

POST /predict {"rows": [...]} (the JSON rows ``daskhps serve`` takes) -> {"version": the export's
commit, "probabilities": [...]}. Per request: parse the JSON, turn the dense fields into floats
with the export's clip, log1p and fill, key the categorical cells with daskhps's own hash (so
that the keys match the table's), look each key up in a plain dict of key -> row of the dump (an
unseen key gets its initial row), run the TorchScript model (on one torch thread, as ``daskhps
serve`` runs it by default), answer JSON. No validation, no version, no metrics, no cache: what
scoring one request costs at the least in Python on this machine. Prints ``ready`` once
listening.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import numpy as np
import torch
import tornado.httpserver
import tornado.web

from daskhps.data.hashing import hash_rows
from daskhps.table.init import init_embedding


def _number(v: object) -> float:
    return float("nan") if v is None or v == "" else float(v)  # type: ignore[arg-type]


class Floor:
    def __init__(self, folder: Path) -> None:
        meta = json.loads((folder / "export.json").read_text())
        self.model = torch.jit.load(str(folder / meta["files"]["model"]))
        keys = np.load(folder / meta["files"]["keys"])
        self.emb = np.load(folder / meta["files"]["embeddings"])
        self.index = dict(zip(keys.tolist(), range(len(keys)), strict=True))  # key -> row
        self.dense = meta["features"]["dense"]
        self.fields = [f["name"] for f in meta["features"]["categorical"]]
        self.init = meta["unseen_keys"]
        self.version = meta["commit"]

    def score(self, rows: list[dict]) -> list[float]:
        n, nf = len(rows), len(self.fields)
        dense = np.empty((n, len(self.dense)), dtype=np.float32)
        for j, f in enumerate(self.dense):
            x = np.array([_number(r.get(f["name"])) for r in rows])
            missing = np.isnan(x)
            x = np.clip(x, f["clip_min"], f["clip_max"])
            if f["transform"] == "log1p":
                x = np.log1p(x)
            x[missing] = f["fill"]
            dense[:, j] = x
        keys = hash_rows([r.get(c) for r in rows for c in self.fields], self.fields).reshape(-1)
        where = np.array([self.index.get(k, -1) for k in keys.tolist()])
        sparse = self.emb[where]
        unseen = where < 0
        if unseen.any():
            sparse[unseen] = init_embedding(
                torch.from_numpy(keys[unseen]),
                seed=self.init["seed"],
                dim=self.init["dim"],
                scale=self.init["scale"],
            ).numpy()
        with torch.no_grad():
            logits = self.model(torch.from_numpy(dense), torch.from_numpy(sparse).view(n, nf, -1))
        return torch.sigmoid(logits).tolist()


class Predict(tornado.web.RequestHandler):
    def initialize(self, floor: Floor) -> None:
        self.floor = floor

    def post(self) -> None:
        rows = json.loads(self.request.body)["rows"]
        self.set_header("Content-Type", "application/json")
        answer = {"version": self.floor.version, "probabilities": self.floor.score(rows)}
        self.finish(json.dumps(answer))


async def main(folder: str, port: int) -> None:
    torch.set_num_threads(1)  # as daskhps serve runs it by default
    app = tornado.web.Application([("/predict", Predict, {"floor": Floor(Path(folder))})])
    tornado.httpserver.HTTPServer(app).listen(port, "127.0.0.1")
    print("ready", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
