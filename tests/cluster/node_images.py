"""Images on the real nodes: imported (and unpacked) once into node 0's containerd, then shared with nodes 1.. by
hard links (tests/cluster/netnodes.py clone_images), so each image's layers are stored once on this machine."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import IO

from tests.cluster import controlplane as cp
from tests.cluster import netnodes
from tests.cluster import node_host as h
from tests.cluster.controlplane import ClusterState, StartError
from tests.cluster.node import NodeState, _ctr, _ctr_argv, _named, _state


def import_images(directory: Path, tarballs: list[Path]) -> None:
    """Import `docker save` / docker-archive tarballs into the real node's containerd (k8s.io namespace)."""
    ns = _state(directory)
    for tar in tarballs:
        _ctr(ns, "images", "import", "--no-unpack", str(tar))
    share(ns)


def import_unpacked(directory: Path, image: str, archive: IO[bytes], *, share_now: bool = True) -> int:
    """Import a `docker save` stream, unpack it into the overlayfs snapshotter now, then delete its layer blobs:
    the snapshots are all a container needs, and keeping both would hold a 6 GB image twice on a disk whose
    running low makes the kubelet evict pods and images (docs/e2e.md). Returns the bytes of blobs discarded.
    containerd 1.6 (Debian's) has no `discard_unpacked_layers` for imports, so this is what that option does."""
    ns = _state(directory)
    proc = subprocess.run(_ctr_argv(ns, "images", "import", "-"), stdin=archive, capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        raise StartError(f"ctr images import {image} failed ({proc.returncode}): {proc.stderr.strip()}")
    ref = _normalized(image)
    # `images check` columns: REF TYPE DIGEST STATUS SIZE UNPACKED; unpacked is what makes the blobs redundant.
    row = next((line.split() for line in _ctr(ns, "images", "check", f"name=={ref}").splitlines()[1:]
                if line.split()[:1] == [ref]), None)
    if row is None or row[-1] != "true":
        raise StartError(f"{ref} is not unpacked after import: {row}")
    layers = _layer_blobs(ns, row[2])
    if layers:
        _ctr(ns, "content", "rm", *layers)
    # `content rm` only drops the metadata; containerd deletes the files at a garbage collection that its default
    # thresholds may not run for a long time (6 GB stayed on disk, and hard links would have shared them).
    blobs = ns.dir_of(0) / "containerd" / "root" / "io.containerd.content.v1.content" / "blobs"
    for digest in layers:
        algorithm, _, hexdigest = digest.partition(":")
        (blobs / algorithm / hexdigest).unlink(missing_ok=True)
    if share_now:
        share(ns)
    return sum(layers.values())


def _normalized(image: str) -> str:
    """The name containerd stores for a `docker save` of `image` (Docker's reference normalization)."""
    first, _, rest = image.partition("/")
    if not rest:
        return f"docker.io/library/{image}"
    return image if "." in first or ":" in first or first == "localhost" else f"docker.io/{image}"


def _layer_blobs(ns: NodeState, digest: str) -> dict[str, int]:
    """Layer digest -> size under a manifest or index (docker save writes either, by Docker version)."""
    doc = json.loads(_ctr(ns, "content", "get", digest))
    if "manifests" in doc:  # an index: its manifests whose content is here (other platforms were not imported)
        here = set(_ctr(ns, "content", "ls", "-q").split())
        return {k: v for m in doc["manifests"] if m["digest"] in here for k, v in _layer_blobs(ns, m["digest"]).items()}
    return {layer["digest"]: int(layer["size"]) for layer in doc.get("layers", [])}


def respawn(ns: NodeState, name: str) -> subprocess.Popen[bytes]:
    """Start a node process again with the argv it first ran with (after clone_images, or a node's power-on)."""
    state = ClusterState.load(Path(ns.dir))
    if state is None:
        raise StartError(f"no control plane in {ns.dir}")
    proc = cp._start(state, name, ns.argv[name])
    ns.pids[name] = proc.pid
    ns.save()
    return proc


def restart_containerd(ns: NodeState, k: int, timeout: float = 60) -> None:
    """Start node k's containerd again and wait until it answers."""
    name = _named("containerd", k)
    proc = respawn(ns, name)
    deadline = time.monotonic() + timeout
    # `ctr version` prints the client's version even when the server does not answer: the exit code tells.
    while subprocess.run(_ctr_argv(ns, "version", node=k), capture_output=True, check=False).returncode != 0:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise StartError(f"{name} did not start again (logs/{name}.log)")
        time.sleep(0.2)


def share(ns: NodeState, *, source: Path | None = None, also: tuple[Path, ...] = ()) -> None:
    """Nodes 1..: node 0's images, by hard links; every containerd restarts once (the kubelets reconnect).
    ``source``/``also``: restore every node from a saved copy, or save one beside them (netnodes.clone_images)."""
    if ns.nodes < 2 and source is None and not also:
        return
    t0 = time.monotonic()
    names = [_named("containerd", k) for k in range(ns.nodes)]

    def restart(*, stop: bool) -> None:
        if stop:
            h.stop_pids([ns.pids[n] for n in names])
            return
        for k in range(ns.nodes):
            restart_containerd(ns, k)

    netnodes.clone_images({k: ns.socket_of(k) for k in range(ns.nodes)},
                          {k: ns.dir_of(k) / "containerd" / "root" for k in range(ns.nodes)}, restart,
                          source=source, also=also)
    state = ClusterState.load(Path(ns.dir))
    assert state is not None
    netnodes.wait_nodes_ready(state, [ns.name_of(k) for k in range(ns.nodes)])
    what = "restored from a saved copy" if source else f"shared with nodes 1..{ns.nodes - 1} by hard links"
    cp.log(f"images {what}{' and saved' if also else ''}", t0)


def saved_images_key(ns: NodeState, image_ids: list[str]) -> str:
    """What a saved copy of the nodes' images must match: the images to import (their IDs), what node 0 holds now
    (pause and probe, from this session's build) and the containerd that wrote it."""
    import hashlib

    held = sorted(_ctr(ns, "images", "ls").splitlines()[1:])
    # Not all of `ctr version`: its server UUID is new with every containerd root, so every session's key differed.
    version = [line for line in _ctr(ns, "version").splitlines() if "UUID" not in line]
    return hashlib.sha256("\n".join([*image_ids, *held, *version]).encode()).hexdigest()[:16]


def held(ns: NodeState) -> list[str]:
    """The image names node 0's containerd holds now."""
    return sorted(_ctr(ns, "images", "ls", "-q").split())


def required(ns: NodeState, images: list[str]) -> list[str]:
    """What a saved copy must hold to be worth restoring: what node 0 holds now (pause and probe, before any import)
    and every image to import, by the name containerd stores."""
    return sorted({*held(ns), *(_normalized(i) for i in images)})


def restore(ns: NodeState, saved: Path, need: list[str]) -> bool:
    """Every node's images from a copy that ``save`` left (hard links, so no layer is written again): True when
    there was one holding every image in ``need``; False (nothing changed) otherwise, or when it is on another file
    system than the nodes. A copy without its list of images, or lacking one, is removed: restored, it would leave
    the nodes without a sandbox image and every pod ContainerCreating."""
    listed = _listed(saved)
    if listed is None:
        return False
    if lacking := sorted(set(need) - set(listed)):
        cp.log(f"saved images at {saved} lack {', '.join(lacking)}; removed, importing", time.monotonic())
        shutil.rmtree(saved, ignore_errors=True)
        return False
    try:
        share(ns, source=saved)
    except (StartError, OSError, subprocess.CalledProcessError) as err:
        cp.log(f"saved images at {saved} not usable ({err}); importing", time.monotonic())
        return False
    return True


def _listed(saved: Path) -> list[str] | None:
    """The images a saved copy holds, from its ``.complete`` (None: no complete copy, or one without its list)."""
    try:
        doc = json.loads((saved / ".complete").read_text())
    except (OSError, ValueError):
        return None
    return [str(i) for i in doc["images"]] if isinstance(doc, dict) and isinstance(doc.get("images"), list) else None


def save(ns: NodeState, saved: Path, need: list[str]) -> None:
    """Keep node 0's images at ``saved`` (hard links: nothing is stored twice while both exist) for the next
    session's ``restore``; earlier saved copies beside it are removed (a 6 GB image is worth one copy). Refuses,
    naming them, when node 0 lacks an image of ``need``: the kubelet deletes unused images (pause and probe first)
    when the disk falls under its eviction threshold, and this run's pods would then never start either."""
    if lacking := sorted(set(need) - set(now := held(ns))):
        free = shutil.disk_usage(ns.dir).free / 1e9
        raise StartError(f"node 0's containerd lost {', '.join(lacking)} while images were imported ({free:.0f} GB "
                         f"free now): the kubelet removes unused images when the disk falls under its eviction "
                         f"threshold (logs/kubelet*.log, 'Removing image to free bytes'); free disk and run again")
    for old in saved.parent.glob("*"):
        if old != saved:
            shutil.rmtree(old, ignore_errors=True)
    shutil.rmtree(saved, ignore_errors=True)
    share(ns, also=(saved,))
    stamp = {"saved": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "images": now}
    (saved / ".complete").write_text(json.dumps(stamp))
