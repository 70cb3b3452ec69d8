"""The tables. Plain SQLAlchemy declarative models (no Flask), shared by every process."""

from b2bhub.models.acks import AckReceived, AckWait
from b2bhub.models.base import Base, utcnow
from b2bhub.models.documents import AckJob, AckNumber, MessageAttribute
from b2bhub.models.expected import ExpectedRule, ExpectedWindow
from b2bhub.models.messages import Delivery, HistoryLine, Message, Payload
from b2bhub.models.notifications import Notification, NotificationChannel
from b2bhub.models.parties import (
    ORGANIZATION,
    PARTNER,
    Certificate,
    Party,
    PartyIdentity,
    ProtocolProfile,
)
from b2bhub.models.pickups import PollerPickup
from b2bhub.models.plugins import InstanceState, PluginInstance, Route
from b2bhub.models.system import (
    Alert,
    ApiToken,
    CleanupRun,
    Lock,
    LogRecord,
    Process,
    ScorecardDay,
    Setting,
    StatsMinute,
    User,
)

__all__ = [
    "ORGANIZATION", "PARTNER", "AckJob", "AckNumber", "AckReceived", "AckWait", "Alert",
    "ApiToken", "Base", "Certificate", "CleanupRun",
    "Delivery", "ExpectedRule", "ExpectedWindow",
    "HistoryLine", "InstanceState", "Lock", "LogRecord", "Message",
    "MessageAttribute",
    "Notification", "NotificationChannel", "Party", "PartyIdentity", "Payload", "PluginInstance",
    "PollerPickup", "Process", "ProtocolProfile", "Route", "ScorecardDay", "Setting",
    "StatsMinute", "User",
    "utcnow",
]
