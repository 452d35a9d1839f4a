package cpu

// link is the pair of intrusive list pointers of one element; -1 is nil.
// Links live in their own array, parallel to the elements, so that one
// list implementation serves both block slots and ARC ghost entries.
type link struct{ prev, next int32 }

// list is a doubly linked list over indices of a []link, oldest (LRU) at
// head, newest (MRU) at tail. The zero value is not usable: start from
// emptyList.
type list struct {
	head, tail int32
	n          int
}

var emptyList = list{head: -1, tail: -1}

func (l *list) pushBack(ls []link, i int32) {
	ls[i] = link{prev: l.tail, next: -1}
	if l.tail >= 0 {
		ls[l.tail].next = i
	} else {
		l.head = i
	}
	l.tail = i
	l.n++
}

func (l *list) unlink(ls []link, i int32) {
	p, n := ls[i].prev, ls[i].next
	if p >= 0 {
		ls[p].next = n
	} else {
		l.head = n
	}
	if n >= 0 {
		ls[n].prev = p
	} else {
		l.tail = p
	}
	ls[i] = link{prev: -1, next: -1}
	l.n--
}

func (l *list) moveToBack(ls []link, i int32) {
	t := l.tail
	if t == i {
		return
	}
	// i is listed and not the tail, so it has a next and the list a tail.
	p, n := ls[i].prev, ls[i].next
	if p >= 0 {
		ls[p].next = n
	} else {
		l.head = n
	}
	ls[n].prev = p
	ls[i] = link{prev: t, next: -1}
	ls[t].next = i
	l.tail = i
}
