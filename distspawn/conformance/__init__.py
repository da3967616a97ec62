"""The tests of the backend conformance suite, by area.

Each module holds one mixin of test methods; ``DistributedTest._DistTestBase``
(in ``distspawn.distributed_test``) combines them. The mixins are not TestCase
classes, so no runner collects them on their own.
"""

from .collectives import CollectiveTests
from .objects import ObjectTests
from .point_to_point import BarrierTests, PointToPointTests
from .topology import GroupTests
from .training import DataTests, DDPTests

__all__ = ["BarrierTests", "CollectiveTests", "DDPTests", "DataTests", "GroupTests",
           "ObjectTests", "PointToPointTests"]
