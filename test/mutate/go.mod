module github.com/hastate/hastate/test/mutate

go 1.26
