"""The TestCase classes users derive from: thin glue over ``distspawn.engine``."""
