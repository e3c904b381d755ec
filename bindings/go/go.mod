module gptoss

go 1.19
