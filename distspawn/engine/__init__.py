"""How ranks run: start them, watch them, judge them. Imports nothing of unittest or pytest; the test case classes in ``distspawn.cases`` are glue over it."""
