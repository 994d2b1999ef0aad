module ddpjob.local/probe

go 1.24
