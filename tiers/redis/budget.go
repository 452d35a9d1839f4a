package redis

import (
	"context"
	"strings"

	goredis "github.com/redis/go-redis/v9"

	"github.com/kvtier/kvtier/offload"
)

// max_bytes (remote.Budget): the tier lists its blocks on every master at
// startup and deletes victims to make room.

// listBatch is the SCAN count and the size of one STRLEN pipeline.
const listBatch = 1000

// list calls add for every key under the tier's prefix that names a
// block, with the length of its value, on every master of a cluster.
func (t *Tier) list(ctx context.Context, add func(offload.Key, int64)) error {
	match := globEscape(t.cfg.KeyPrefix) + "*"
	scan := func(ctx context.Context, c *goredis.Client) error {
		var cursor uint64
		for {
			names, next, err := c.Scan(ctx, cursor, match, listBatch).Result()
			if err != nil {
				return err
			}
			var keys []offload.Key
			var cmds []*goredis.IntCmd
			pipe := c.Pipeline()
			for _, name := range names {
				if k, ok := t.parseKey(name); ok {
					keys = append(keys, k)
					cmds = append(cmds, pipe.StrLen(ctx, name))
				}
			}
			if len(cmds) > 0 {
				if _, err := pipe.Exec(ctx); err != nil {
					return err
				}
			}
			for i, k := range keys {
				if n := cmds[i].Val(); n > 0 { // 0: deleted since the scan
					add(k, n)
				}
			}
			if next == 0 {
				return nil
			}
			cursor = next
		}
	}
	if cc, ok := t.client.(*goredis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, scan)
	}
	return scan(ctx, t.client.(*goredis.Client))
}

// del deletes keys in one pipeline (a cluster client sends each to its
// master), within one timeout; a key whose master failed it is returned.
func (t *Tier) del(ctx context.Context, keys []offload.Key) (failed []offload.Key, err error) {
	ctx, cancel := context.WithTimeout(ctx, t.cfg.Timeout)
	defer cancel()
	pipe := t.client.Pipeline()
	cmds := make([]*goredis.IntCmd, len(keys))
	for i, k := range keys {
		cmds[i] = pipe.Del(ctx, t.redisKey(k))
	}
	_, err = pipe.Exec(ctx)
	for i, c := range cmds {
		if c.Err() != nil {
			failed = append(failed, keys[i])
		}
	}
	return failed, err
}

// globEscape quotes the glob characters of SCAN's MATCH in s.
func globEscape(s string) string {
	var sb strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			sb.WriteByte('\\')
		}
		sb.WriteRune(r)
	}
	return sb.String()
}
