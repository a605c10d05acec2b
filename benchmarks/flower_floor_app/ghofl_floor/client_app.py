"""ClientApp: answer every query with an empty reply (imports flwr only)."""

from __future__ import annotations

from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp

app = ClientApp()


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Reply at once, with no content."""
    del context
    return Message(RecordDict(), reply_to=msg)
