"""Test-only Flower ClientApp: ghofl's ClientApp that can crash its own SuperNode on cue.

The Flower fault tests (``tests/integration/test_flower.py``) run it in place of ghofl's
ClientApp (``LocalFlower.run(..., client_app=FAULT_APP)``, which copies this file into the
Flower app it submits and names its ``app`` as the app's ClientApp). A node whose node config
holds :data:`KILL_KEY` = STAGE SIGKILLs its own SuperNode (and itself) on receiving that
stage's request, before answering: a deterministic crash. Every other request, and every
request of a node without the key, is answered by ghofl's own handler
(:func:`ghofl.integrations.flower.client_app.handle_query`).

The module runs inside the ClientApp process, from the app's folder: it imports only ghofl
and Flower, never the ``tests`` package.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from ghofl.errors import GhoflError
from ghofl.integrations.flower import QUERY_ACTION
from ghofl.integrations.flower.client_app import effective_node_config, handle_query
from ghofl.integrations.flower.records import message_from_record
from ghofl.secure.messages import ServerMessage

#: Node config key: the stage at whose request the node kills its SuperNode.
KILL_KEY = "ghofl-test-kill-at"

app = ClientApp()


@app.query(QUERY_ACTION)
def query(msg: Message, context: Context) -> Message:
    """Crash at the node's kill stage, else answer with ghofl's handler."""
    stage = effective_node_config(context.node_config).get(KILL_KEY)
    if stage is not None and _stage(msg) == stage:
        kill_own_supernode()
    return Message(handle_query(msg.content, context), reply_to=msg)


def _stage(msg: Message) -> str | None:
    """The stage of the ghofl request in ``msg`` (None when it is none)."""
    try:
        request = message_from_record(msg.content, ServerMessage)
    except GhoflError:
        return None  # ghofl's handler answers with the refusal
    return request.stage if isinstance(request, ServerMessage) else None


def kill_own_supernode() -> None:
    """SIGKILL the nearest ancestor running ``flower-supernode``, then this process.

    The SuperNode of a deployment; so the request is never answered.
    """
    pid = os.getppid()
    while pid > 1:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        if b"flower-supernode" in cmd:
            os.kill(pid, signal.SIGKILL)
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    os.kill(os.getpid(), signal.SIGKILL)
