"""GPU compute modes that follow the MPS daemons: EXCLUSIVE_PROCESS on a GPU that one daemon serves.

In EXCLUSIVE_PROCESS mode a GPU takes one CUDA context, the MPS server's, so a process that bypasses MPS (an
unset or wrong CUDA_MPS_PIPE_DIRECTORY makes a client silently run as a plain CUDA process with the whole GPU)
is refused instead of running past its lane's limits; NVIDIA's DRA driver sets it on the GPUs of its MPS claims.
A GPU that two daemons serve (lanes each with their own daemon, or two v3 GPU sets overlapping) needs two
server contexts, so it is set to DEFAULT while they share it. A GPU that no daemon serves any more gets back the
mode it had before the agent first changed it; those modes are kept in a file, so an agent restart does not take
its own setting for the admin's.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from tessera_agent.gpus.backend import COMPUTE_MODES as MODES
from tessera_agent.gpus.backend import ComputeMode as Mode
from tessera_agent.gpus.backend import ComputeModeControl

log = logging.getLogger(__name__)


class ComputeModes:
    def __init__(self, control: ComputeModeControl, state_file: Path) -> None:
        self.control = control
        self.state_file = state_file
        self._original: dict[str, Mode] = self._load()

    def _load(self) -> dict[str, Mode]:
        try:
            data = json.loads(self.state_file.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as err:
            log.warning("compute modes file %s unreadable (%s); starting afresh", self.state_file, err)
            return {}
        return {str(k): v for k, v in data.items() if v in MODES} if isinstance(data, dict) else {}

    def _save(self) -> None:
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.state_file.parent, prefix=".compute-modes-")
        with os.fdopen(fd, "w") as f:
            json.dump(self._original, f, sort_keys=True)
        os.replace(tmp, self.state_file)

    def follow(self, served: Mapping[str, int]) -> None:
        """Set each GPU's mode for the number of daemons that serve it now (GPUs absent serve none)."""
        for uuid in sorted(set(served) | set(self._original)):
            n = served.get(uuid, 0)
            try:
                if n == 0:
                    self._restore(uuid)
                else:
                    self._set(uuid, "ExclusiveProcess" if n == 1 else "Default")
            except Exception as err:  # NVML's errors: one GPU's failure must not stop the others or the lane
                log.warning("GPU %s: compute mode not changed: %s", uuid, err)
        self._save()

    def _set(self, uuid: str, mode: Mode) -> None:
        now = self.control.compute_mode(uuid)
        self._original.setdefault(uuid, now)
        if now != mode:
            self.control.set_compute_mode(uuid, mode)
            log.info("GPU %s: compute mode %s (was %s)", uuid, mode, now)

    def _restore(self, uuid: str) -> None:
        original = self._original.pop(uuid, None)
        if original is not None and self.control.compute_mode(uuid) != original:
            self.control.set_compute_mode(uuid, original)
            log.info("GPU %s: compute mode %s restored", uuid, original)

    def modes(self) -> dict[str, Mode]:
        return {uuid: self.control.compute_mode(uuid) for uuid in sorted(self._original)}
