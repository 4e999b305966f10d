"""frost's test suites; ``harness`` is the accuracy harness every engine suite shares."""
