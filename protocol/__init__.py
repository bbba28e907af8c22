"""quire's ground floor (layer 1): the wire protocol and the types every process shares.

    messages, wire, stream  request/response catalogue, frame codec, framed asyncio streams
    mux                     channels of one replicate connection per (primary, peer)
    spec, fragment, route   JournalSpec, Fragment, Route/Header and their validation
    labels, names, status   label sets and selectors, name rules, the Status enum
    errors                  the typed error tree (one StatusError per status)
    config, logs            typed settings (flags > env > YAML) and structlog set-up

Imports nothing else of quire's; everything a peer or a store sees is defined here.
`native` is imported first: it chooses, before any of them is imported, between the
compiled hot-path modules and their Python sources (docs/compiled.md).
"""

from . import native  # noqa: F401 - first: selects the compiled or the pure hot path

from .errors import (
    FrameTooLarge,
    ProtocolError,
    QuireError,
    StatusError,
    ValidationError,
    for_status,
    raise_for_status,
)
from .fragment import EMPTY_SUM, Codec, Fragment
from .labels import Label, LabelSelector, LabelSet, parse_selector
from .messages import *  # noqa: F403 - the message catalogue is the public surface
from .messages import ALL_MESSAGES, PROTOCOL_VERSION, Message
from .names import validate_journal_name
from .producers import ProducerMark, ProducerSnapshot, validate_identity
from .route import Etcd, Header, ProcessId, Route
from .spec import (
    Flag,
    FragmentSpec,
    JournalSpec,
    Suspend,
    SuspendLevel,
    parse_duration,
    render_postfix,
    validate_store_url,
)
from .status import Status
