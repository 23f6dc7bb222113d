package main

// What the dama command shows its users, spelled as they read it in
// docs/operations.md: the tests hold the command to it.
const (
	webTokenEnv        = "DAMA_WEB_TOKEN"
	webReadTokenEnv    = "DAMA_WEB_READ_TOKEN"
	taskDatabaseURLEnv = "DAMA_TASK_DATABASE_URL"
	// The task program's name beside dama.
	taskProgramName = "dama-taskrunner"
	// dama submit --wait's exit codes.
	exitTaskFailed    = 20
	exitTaskCancelled = 21
	exitTaskUnknown   = 22
	// A terminal's progress: a line drawn again, a screen drawn again.
	clearLine   = "\r\033[K"
	clearScreen = "\033[H\033[2J"
)
