"""This process's name among the gateway's replicas, as reload reports, the rebalancing loop's rounds
and `/admin/flow` name it: host and pid (a host runs several workers)."""

import os
import socket
from typing import Final

REPLICA: Final = f"{socket.gethostname()}:{os.getpid()}"
