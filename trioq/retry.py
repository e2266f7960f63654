"""trioq.retry: how long a failed job waits before its next attempt."""

from ._metadata import fixup_module_metadata
from ._retry import Constant as Constant
from ._retry import Exponential as Exponential
from ._retry import Linear as Linear
from ._retry import RetryPolicy as RetryPolicy
from ._retry import Sidekiq as Sidekiq

fixup_module_metadata(__name__, globals())
del fixup_module_metadata
